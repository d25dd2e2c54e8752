//! The [`Kernel`] of a Q4_K matrix stored in [`crate::q4_k_x16`]'s layout: gemm and gemv
//! rows on the sixteen-lane AVX-512 kernel, any other path (and any other instruction
//! set) on the ggml rows recovered from the layout, through [`crate::q4_k::Q4K`]'s own
//! kernels — slower, the same bits.

use std::ops::Range;

use crate::act::{Activations, ParFor, Q8K};
use crate::layout::Interleave;
use crate::matrix::{kernel_for, AnyActivations, Kernel};
use crate::q4_k::Q4K;
use crate::q4_k_x16::{self, BLOCK_BYTES, GROUP};
use crate::{GgmlType, Isa, KernelError, Path, Quant};

/// [`Kernel`] of repacked Q4_K matrices.
pub(crate) struct Q4KX16;

impl Kernel for Q4KX16 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q4K
    }

    fn quantize(
        &self,
        xs: &[f32],
        rows: usize,
        k: usize,
        paths: &[Path],
        par: ParFor<'_>,
    ) -> Result<AnyActivations, KernelError> {
        kernel_for(GgmlType::Q4K).quantize(xs, rows, k, paths, par)
    }

    fn matmul_range(
        &self,
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        _group: Interleave,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let AnyActivations::Q8K(a) = act else {
            return Err(KernelError::Activations(
                "q4_K weights need q8_K activations".into(),
            ));
        };
        let rows = a.rows();
        let nb = row_bytes / Q4K::BLOCK_BYTES;
        if rows == 0 || features.is_empty() {
            return Ok(());
        }
        if out.len() != rows * features.len()
            || features.end.div_ceil(GROUP) * nb * BLOCK_BYTES > w.len()
            || a.k() != nb * Q4K::BLOCK_VALUES
            || (!paths.is_empty() && paths.len() != rows)
        {
            return Err(KernelError::Activations(format!(
                "{} outputs, {} paths and rows of {} values for {rows} rows × features {features:?} of rows of {nb} q4_K blocks",
                out.len(),
                paths.len(),
                a.k()
            )));
        }
        let path = |j: usize| paths.get(j).copied().unwrap_or(Path::VecDot);
        let fast = |p: Path| isa == Isa::Avx512 && matches!(p, Path::Gemm | Path::Gemv);
        for g in features.start / GROUP..features.end.div_ceil(GROUP) {
            let wg = &w[g * nb * BLOCK_BYTES..(g + 1) * nb * BLOCK_BYTES];
            // This group's weight rows within `features`.
            let r0 = (g * GROUP).max(features.start);
            let r1 = ((g + 1) * GROUP).min(features.end);
            let mut j = 0;
            while j < rows {
                let p = path(j);
                let mut e = j + 1;
                while e < rows && path(e) == p {
                    e += 1;
                }
                if fast(p) {
                    group_rows(wg, nb, a, j..e, p == Path::Gemm, |jj, lanes| {
                        for r in r0..r1 {
                            out[(r - features.start) * rows + jj] = lanes[r - g * GROUP];
                        }
                    });
                } else {
                    for r in r0..r1 {
                        let row = q4_k_x16::row_of(w, nb, r);
                        let o = (r - features.start) * rows;
                        Q4K::path_rows(isa, p, &row, a, j..e, &mut out[o + j..o + e]);
                    }
                }
                j = e;
            }
        }
        Ok(())
    }

    fn dequantize_row(&self, row: &[u8], out: &mut [f32]) {
        kernel_for(GgmlType::Q4K).dequantize_row(row, out);
    }

    fn stored_row(&self, data: &[u8], row_bytes: usize, _group: Interleave, r: usize) -> Vec<u8> {
        q4_k_x16::row_of(data, row_bytes / Q4K::BLOCK_BYTES, r)
    }
}

/// The sixteen lanes of group `wg` for activation rows `js`, in tiles of 4, 2 and 1
/// rows; `put(j, lanes)` receives row `j`'s outputs.
fn group_rows(
    wg: &[u8],
    nb: usize,
    a: &Activations<Q8K>,
    js: Range<usize>,
    gemm: bool,
    mut put: impl FnMut(usize, &[f32; GROUP]),
) {
    let mut j = js.start;
    macro_rules! tile {
        ($r:literal) => {
            while js.end - j >= $r {
                let mut o = [[0f32; GROUP]; $r];
                let rows: [&[_]; $r] = std::array::from_fn(|i| a.row(j + i));
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only called for `Isa::Avx512` (F, BW, VL, VNNI, with AVX2, FMA
                // and F16C); `wg` holds `nb` blocks and every activation row `nb` blocks
                // (checked by the caller).
                unsafe {
                    if gemm {
                        q4_k_x16::x86::group_dots::<$r, true>(wg, nb, rows, &mut o)
                    } else {
                        q4_k_x16::x86::group_dots::<$r, false>(wg, nb, rows, &mut o)
                    }
                }
                for (i, lanes) in o.iter().enumerate() {
                    put(j + i, lanes);
                }
                j += $r;
            }
        };
    }
    tile!(4);
    tile!(2);
    tile!(1);
    let _ = (gemm, nb, wg);
}

#[cfg(test)]
mod tests {
    use crate::paths::{BatchRow, Path};
    use crate::{GgmlType, Isa, QuantMatrix};

    /// A repacked matrix (40 rows: two groups and a padded one) gives the plain ggml
    /// matrix's bits for every path mix, for feature ranges that cut groups, and the
    /// same dequantized rows.
    #[test]
    fn repacked_matrix_equals_the_plain_one() {
        let (n, k) = (40, 512);
        let w = crate::testing::random(n * k, 3);
        let (bytes, _) = crate::testing::quantize(&w, n, k, candle_core::quantized::GgmlDType::Q4K);
        let plain = QuantMatrix::new(GgmlType::Q4K, bytes.clone(), n, k).expect("plain");
        for isa in Isa::available() {
            let fast = QuantMatrix::for_isa(isa, GgmlType::Q4K, bytes.clone(), n, k).expect("fast");
            assert_eq!(fast.interleave() > 1, isa == Isa::Avx512);
            let rows = 11;
            let xs = crate::testing::random(rows * k, 9);
            // A 9-row micro-batch (gemm for 8, gemv for 1), a decode row (gemv) and a
            // tiled-length batch's rows forced to vec_dot and tiled.
            let mut paths = plain.paths(
                &(0..9)
                    .map(|i| BatchRow { index: i, len: 9 })
                    .chain([BatchRow::SINGLE])
                    .collect::<Vec<_>>(),
            );
            paths.push(Path::VecDot);
            assert_eq!(paths[..10].iter().filter(|&&p| p == Path::Gemm).count(), 8);
            for paths in [paths.clone(), vec![Path::Tiled; rows], Vec::new()] {
                let a = plain.quantize_for(&xs, rows, &paths).expect("act");
                for f in [0..n, 3..37, 16..32, 17..18] {
                    let (mut u, mut v) = (vec![0f32; rows * f.len()], vec![0f32; rows * f.len()]);
                    plain
                        .matmul_range_paths(isa, &a, f.clone(), &paths, &mut u)
                        .expect("plain");
                    fast.matmul_range_paths(isa, &a, f.clone(), &paths, &mut v)
                        .expect("fast");
                    let bits = |w: &[f32]| w.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&u), bits(&v), "{isa:?} features {f:?} paths {paths:?}");
                }
            }
            let ids = [0u32, 15, 16, 39];
            assert_eq!(
                plain.dequantize_rows(&ids).expect("rows"),
                fast.dequantize_rows(&ids).expect("rows")
            );
        }
    }
}
