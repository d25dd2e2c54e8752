//! The [`Kernel`] of a K-quant matrix stored sixteen rows at a time
//! ([`crate::q4_k_x16`], [`crate::q6_k_x16`]): the rows whose llama.cpp path the layout's
//! AVX-512 kernel follows run there, any other path (and any other instruction set) on
//! the ggml rows recovered from the layout, through the type's own kernels — slower, the
//! same bits.

use std::marker::PhantomData;
use std::ops::Range;

use crate::act::{Activations, ParFor, Q8KBlock, Q8K};
use crate::layout::Interleave;
use crate::matrix::{kernel_for, AnyActivations, Kernel};
use crate::{GgmlType, Isa, KernelError, Path, Quant, RowsOut};

/// Rows per group of every sixteen-row layout.
const GROUP: usize = 16;

/// One sixteen-row layout: its type, block size, rows and kernel.
pub(crate) trait Sixteen: Send + Sync + 'static {
    /// The ggml type stored.
    type Q: Quant<Act = Q8K>;
    /// Bytes of one stored block of sixteen rows.
    const BLOCK_BYTES: usize;
    /// Whether the layout's kernel follows `path`.
    fn fast(path: Path) -> bool;
    /// Activation rows per kernel call on `path` (4, 2 or 1): as many as keep the
    /// kernel's accumulators in registers.
    fn tile(path: Path) -> usize;
    /// Row `r` of the stored bytes, in ggml's layout.
    fn row_of(packed: &[u8], nb: usize, r: usize) -> Vec<u8>;
    /// `out[r][l] = w_l · a[r]` on `path` (one [`Self::fast`] accepts).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI with AVX2, FMA and F16C; `w` holds `nb` blocks, every `a[r]`
    /// at least `nb`.
    unsafe fn dots<const R: usize>(
        w: &[u8],
        nb: usize,
        a: [&[Q8KBlock]; R],
        path: Path,
        out: &mut [[f32; GROUP]; R],
    );
}

/// A [`Sixteen`] over the module `$m` (its `BLOCK_BYTES`, `fast`, `tile`, `row_of` and
/// `x86::group_dots`, whose `true` form serves `$first` and `false` form the other fast
/// path).
macro_rules! sixteen {
    ($(#[$doc:meta])* $name:ident, $q:ty, $m:ident, $first:expr) => {
        $(#[$doc])*
        pub(crate) struct $name;

        impl Sixteen for $name {
            type Q = $q;
            const BLOCK_BYTES: usize = crate::$m::BLOCK_BYTES;
            fn fast(path: Path) -> bool {
                crate::$m::fast(path)
            }
            fn tile(path: Path) -> usize {
                crate::$m::tile(path)
            }
            fn row_of(packed: &[u8], nb: usize, r: usize) -> Vec<u8> {
                crate::$m::row_of(packed, nb, r)
            }
            unsafe fn dots<const R: usize>(
                w: &[u8],
                nb: usize,
                a: [&[Q8KBlock]; R],
                path: Path,
                out: &mut [[f32; GROUP]; R],
            ) {
                #[cfg(target_arch = "x86_64")]
                return if path == $first {
                    crate::$m::x86::group_dots::<R, true>(w, nb, a, out)
                } else {
                    crate::$m::x86::group_dots::<R, false>(w, nb, a, out)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (w, nb, a, path, out);
            }
        }
    };
}

sixteen!(
    /// Q4_K in [`crate::q4_k_x16`]'s layout (llama.cpp's gemm and gemv rows).
    Q4KX16,
    crate::q4_k::Q4K,
    q4_k_x16,
    Path::Gemm
);
sixteen!(
    /// Q6_K in [`crate::q6_k_x16`]'s layout (llama.cpp's tiled and vec_dot rows).
    Q6KX16,
    crate::q6_k::Q6K,
    q6_k_x16,
    Path::Tiled
);

/// [`Kernel`] of a sixteen-row layout.
pub(crate) struct X16<S>(PhantomData<fn() -> S>);

/// The Q4_K layout's kernel.
pub(crate) static Q4K_X16: X16<Q4KX16> = X16(PhantomData);
/// The Q6_K layout's kernel.
pub(crate) static Q6K_X16: X16<Q6KX16> = X16(PhantomData);

impl<S: Sixteen> Kernel for X16<S> {
    fn ty(&self) -> GgmlType {
        S::Q::TYPE
    }

    fn quantize(
        &self,
        xs: &[f32],
        rows: usize,
        k: usize,
        paths: &[Path],
        par: ParFor<'_>,
    ) -> Result<AnyActivations, KernelError> {
        kernel_for(S::Q::TYPE).quantize(xs, rows, k, paths, par)
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
        let Some((a, nb)) = checked::<S>(w, row_bytes, act, &features, paths)? else {
            return Ok(());
        };
        let rows = a.rows();
        if out.len() != rows * features.len() {
            return Err(KernelError::Activations(format!(
                "{} outputs for {rows} rows × features {features:?}",
                out.len()
            )));
        }
        let fast = |p: Path| isa == Isa::Avx512 && S::fast(p);
        for g in features.start / GROUP..features.end.div_ceil(GROUP) {
            let wg = &w[g * nb * S::BLOCK_BYTES..(g + 1) * nb * S::BLOCK_BYTES];
            // This group's weight rows within `features`.
            let r0 = (g * GROUP).max(features.start);
            let r1 = ((g + 1) * GROUP).min(features.end);
            for (js, p) in path_runs(paths, rows) {
                let (j, e) = (js.start, js.end);
                if fast(p) {
                    group_rows::<S>(wg, nb, a, j..e, p, |jj, lanes| {
                        for r in r0..r1 {
                            out[(r - features.start) * rows + jj] = lanes[r - g * GROUP];
                        }
                    });
                } else {
                    for r in r0..r1 {
                        let row = S::row_of(w, nb, r);
                        let o = (r - features.start) * rows;
                        S::Q::path_rows(isa, p, &row, a, j..e, &mut out[o + j..o + e]);
                    }
                }
            }
        }
        Ok(())
    }

    fn matmul_range_rows(
        &self,
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        _group: Interleave,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut RowsOut<'_>,
    ) -> Result<bool, KernelError> {
        let all_fast = if paths.is_empty() {
            S::fast(Path::VecDot)
        } else {
            paths.iter().all(|&p| S::fast(p))
        };
        if isa != Isa::Avx512 || !all_fast {
            return Ok(false);
        }
        let Some((a, nb)) = checked::<S>(w, row_bytes, act, &features, paths)? else {
            return Ok(true);
        };
        let rows = a.rows();
        for g in features.start / GROUP..features.end.div_ceil(GROUP) {
            let wg = &w[g * nb * S::BLOCK_BYTES..(g + 1) * nb * S::BLOCK_BYTES];
            // This group's weight rows within `features`, as lanes.
            let r0 = (g * GROUP).max(features.start);
            let lanes = r0 - g * GROUP..((g + 1) * GROUP).min(features.end) - g * GROUP;
            for (js, p) in path_runs(paths, rows) {
                group_rows::<S>(wg, nb, a, js, p, |jj, o| out.put(jj, r0, &o[lanes.clone()]));
            }
        }
        Ok(true)
    }

    fn dequantize_row(&self, row: &[u8], out: &mut [f32]) {
        kernel_for(S::Q::TYPE).dequantize_row(row, out);
    }

    fn stored_row(&self, data: &[u8], row_bytes: usize, _group: Interleave, r: usize) -> Vec<u8> {
        S::row_of(data, row_bytes / S::Q::BLOCK_BYTES, r)
    }
}

/// The runs of consecutive activation rows (of `rows`) that share a path, in order
/// (every row [`Path::VecDot`] when `paths` is empty).
fn path_runs(paths: &[Path], rows: usize) -> impl Iterator<Item = (Range<usize>, Path)> + '_ {
    let path = move |j: usize| paths.get(j).copied().unwrap_or(Path::VecDot);
    let mut j = 0;
    std::iter::from_fn(move || {
        if j >= rows {
            return None;
        }
        let (start, p) = (j, path(j));
        while j < rows && path(j) == p {
            j += 1;
        }
        Some((start..j, p))
    })
}

/// The Q8_K activations and blocks per row of a product of `features`, checked against
/// the stored bytes and `paths`; `None` when there is nothing to compute.
fn checked<'a, S: Sixteen>(
    w: &[u8],
    row_bytes: usize,
    act: &'a AnyActivations,
    features: &Range<usize>,
    paths: &[Path],
) -> Result<Option<(&'a Activations<Q8K>, usize)>, KernelError> {
    let AnyActivations::Q8K(a) = act else {
        return Err(KernelError::Activations(format!(
            "{} weights need q8_K activations",
            S::Q::TYPE.name()
        )));
    };
    let rows = a.rows();
    let nb = row_bytes / S::Q::BLOCK_BYTES;
    if rows == 0 || features.is_empty() {
        return Ok(None);
    }
    if features.end.div_ceil(GROUP) * nb * S::BLOCK_BYTES > w.len()
        || a.k() != nb * S::Q::BLOCK_VALUES
        || (!paths.is_empty() && paths.len() != rows)
    {
        return Err(KernelError::Activations(format!(
            "{} paths and rows of {} values for {rows} rows × features {features:?} of rows of {nb} {} blocks",
            paths.len(),
            a.k(),
            S::Q::TYPE.name()
        )));
    }
    Ok(Some((a, nb)))
}

/// The sixteen lanes of group `wg` for activation rows `js`, in tiles of 4, 2 and 1
/// rows; `put(j, lanes)` receives row `j`'s outputs.
fn group_rows<S: Sixteen>(
    wg: &[u8],
    nb: usize,
    a: &Activations<Q8K>,
    js: Range<usize>,
    path: Path,
    mut put: impl FnMut(usize, &[f32; GROUP]),
) {
    let mut j = js.start;
    macro_rules! tile {
        ($r:literal) => {
            while js.end - j >= $r && S::tile(path) >= $r {
                let mut o = [[0f32; GROUP]; $r];
                let rows: [&[_]; $r] = std::array::from_fn(|i| a.row(j + i));
                // SAFETY: only called for `Isa::Avx512` (F, BW, VL, VNNI, with AVX2, FMA
                // and F16C); `wg` holds `nb` blocks and every activation row `nb` blocks
                // (checked by the caller).
                unsafe { S::dots::<$r>(wg, nb, rows, path, &mut o) };
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
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::GgmlDType;

    use crate::paths::{BatchRow, Path};
    use crate::{GgmlType, Isa, QuantMatrix, RowsOut};

    /// A stored matrix (40 rows: two groups and a padded one) gives the plain ggml
    /// matrix's bits for every path mix (Q4_K: a 9-row micro-batch's gemm and gemv rows
    /// and a decode row; Q6_K: vec_dot and tiled rows; both: the other paths, through the
    /// recovered rows), for feature ranges that cut groups, and the same dequantized rows.
    fn check(ty: GgmlType, dtype: GgmlDType) {
        let (n, k) = (40, 512);
        let w = crate::testing::random(n * k, 3);
        let (bytes, _) = crate::testing::quantize(&w, n, k, dtype);
        let plain = QuantMatrix::new(ty, bytes.clone(), n, k).expect("plain");
        let rows = 11;
        let xs = crate::testing::random(rows * k, 9);
        let mut mixed = plain.paths(
            &(0..9)
                .map(|i| BatchRow { index: i, len: 9 })
                .chain([BatchRow::SINGLE])
                .collect::<Vec<_>>(),
        );
        mixed.push(Path::VecDot);
        let mut all = vec![Path::Tiled; 6];
        all.extend([
            Path::VecDot,
            Path::Gemm,
            Path::Gemv,
            Path::VecDot,
            Path::Tiled,
        ]);
        for isa in Isa::available() {
            let fast = QuantMatrix::for_isa(isa, ty, bytes.clone(), n, k).expect("fast");
            assert_eq!(fast.interleave() > 1, isa == Isa::Avx512);
            for paths in [
                mixed.clone(),
                all.clone(),
                vec![Path::Tiled; rows],
                vec![Path::Gemm; rows],
                Vec::new(),
            ] {
                let a = plain.quantize_for(&xs, rows, &paths).expect("act");
                for f in [0..n, 3..37, 16..32, 17..18] {
                    let (mut u, mut v) = (vec![0f32; rows * f.len()], vec![0f32; rows * f.len()]);
                    plain
                        .matmul_range_paths(isa, &a, f.clone(), &paths, &mut u)
                        .expect("plain");
                    fast.matmul_range_paths(isa, &a, f.clone(), &paths, &mut v)
                        .expect("fast");
                    let bits = |w: &[f32]| w.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&u),
                        bits(&v),
                        "{ty:?} {isa:?} features {f:?} paths {paths:?}"
                    );
                    // The row-major form, where the kernel has one: the same bits, each
                    // output written once.
                    let mut w = vec![f32::NAN; rows * f.len()];
                    let done = fast
                        .matmul_range_rows(
                            isa,
                            &a,
                            f.clone(),
                            &paths,
                            &mut RowsOut::new(&mut w, rows, f.clone()),
                        )
                        .expect("rows");
                    let fast_paths = if ty == GgmlType::Q4K {
                        [Path::Gemm, Path::Gemv].as_slice()
                    } else {
                        [Path::VecDot, Path::Tiled].as_slice()
                    };
                    let all_fast = if paths.is_empty() {
                        fast_paths.contains(&Path::VecDot)
                    } else {
                        paths.iter().all(|p| fast_paths.contains(p))
                    };
                    assert_eq!(done, isa == Isa::Avx512 && all_fast, "{ty:?} {paths:?}");
                    if done {
                        // Row-major here, weight-row major in `u`.
                        let t: Vec<f32> = (0..f.len())
                            .flat_map(|c| (0..rows).map(move |j| (c, j)))
                            .map(|(c, j)| w[j * f.len() + c])
                            .collect();
                        assert_eq!(bits(&u), bits(&t), "{ty:?} rows {f:?} {paths:?}");
                    }
                }
            }
            let ids = [0u32, 15, 16, 39];
            assert_eq!(
                plain.dequantize_rows(&ids).expect("rows"),
                fast.dequantize_rows(&ids).expect("rows")
            );
        }
    }

    #[test]
    fn stored_q4_k_matrix_equals_the_plain_one() {
        let q4 = QuantMatrix::new(GgmlType::Q4K, vec![0; 40 * 2 * 144], 40, 512).expect("q4_k");
        let paths = q4.paths(&[BatchRow { index: 0, len: 9 }, BatchRow::SINGLE]);
        assert_eq!(paths, [Path::Gemm, Path::Gemv]);
        check(GgmlType::Q4K, GgmlDType::Q4K);
    }

    #[test]
    fn stored_q6_k_matrix_equals_the_plain_one() {
        check(GgmlType::Q6K, GgmlDType::Q6K);
    }
}
