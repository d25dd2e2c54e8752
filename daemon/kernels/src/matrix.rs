//! One weight matrix of any implemented type behind one object-safe interface.

use std::marker::PhantomData;
use std::ops::Range;

use crate::act::{self, ActFormat, Activations, ParFor};
use crate::layout::{self, Interleave};
use crate::paths::{self, BatchRow, Path};
use crate::rows_out::RowsOut;
use crate::tiles::TILE;
use crate::{GgmlType, Isa, KernelError, Quant};

/// Activations in whichever format a matrix's type needs ([`Kernel::quantize`]).
pub enum AnyActivations {
    Q8_0(Activations<act::Q8_0>),
    Q8_1(Activations<act::Q8_1>),
    Q8K(Activations<act::Q8K>),
    F16(Activations<act::F16>),
    Bf16(Activations<act::Bf16>),
    F32(Activations<act::F32>),
}

impl AnyActivations {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        match self {
            AnyActivations::Q8_0(a) => a.rows(),
            AnyActivations::Q8_1(a) => a.rows(),
            AnyActivations::Q8K(a) => a.rows(),
            AnyActivations::F16(a) => a.rows(),
            AnyActivations::Bf16(a) => a.rows(),
            AnyActivations::F32(a) => a.rows(),
        }
    }
}

/// Moves a format's activations in and out of [`AnyActivations`].
pub trait Wrap: ActFormat + Sized {
    fn wrap(a: Activations<Self>) -> AnyActivations;
    fn unwrap(a: &AnyActivations) -> Option<&Activations<Self>>;
}

macro_rules! wrap {
    ($fmt:ty, $var:ident) => {
        impl Wrap for $fmt {
            fn wrap(a: Activations<Self>) -> AnyActivations {
                AnyActivations::$var(a)
            }
            fn unwrap(a: &AnyActivations) -> Option<&Activations<Self>> {
                match a {
                    AnyActivations::$var(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
wrap!(act::Q8_0, Q8_0);
wrap!(act::Q8_1, Q8_1);
wrap!(act::Q8K, Q8K);
wrap!(act::F16, F16);
wrap!(act::Bf16, Bf16);
wrap!(act::F32, F32);

/// A weight type's kernels behind dynamic dispatch (one per [`Quant`] type).
pub trait Kernel: Send + Sync {
    /// The weight type.
    fn ty(&self) -> GgmlType;
    /// Converts `rows × k` f32 activations to the type's activation format, row `j` as
    /// its path `paths[j]` quantizes it (all [`Path::VecDot`] when `paths` is empty).
    fn quantize(
        &self,
        xs: &[f32],
        rows: usize,
        k: usize,
        paths: &[Path],
        par: ParFor<'_>,
    ) -> Result<AnyActivations, KernelError>;
    /// `out[(r − features.start) · rows + j] = w_r · a_j` for every activation row `j`
    /// (of `rows`) and weight row `r` in `features` (weight-row major, so that threads
    /// computing disjoint feature ranges write disjoint slices); `w` holds all rows,
    /// `row_bytes` each, in groups of `group` ([`Interleave`]). Activation row `j` goes
    /// through llama.cpp's kernel `paths[j]` (all [`Path::VecDot`] when `paths` is
    /// empty; interleaved rows have no other path).
    #[allow(clippy::too_many_arguments)]
    fn matmul_range(
        &self,
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        group: Interleave,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut [f32],
    ) -> Result<(), KernelError>;
    /// [`Self::matmul_range`] written row-major into `out` (which holds `features`), as
    /// products are formed, every pair of `features` × rows exactly once. `Ok(false)`
    /// (nothing written) where the kernel has no such form for this instruction set and
    /// these paths; the caller then takes [`Self::matmul_range`] and transposes.
    #[allow(clippy::too_many_arguments)]
    fn matmul_range_rows(
        &self,
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        group: Interleave,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut RowsOut<'_>,
    ) -> Result<bool, KernelError> {
        let _ = (isa, w, row_bytes, group, act, features, paths, out);
        Ok(false)
    }
    /// ggml's dequantization of one row.
    fn dequantize_row(&self, row: &[u8], out: &mut [f32]);
    /// Row `r` of the stored bytes `data`, in ggml's layout (`row_bytes` bytes).
    fn stored_row(&self, data: &[u8], row_bytes: usize, group: Interleave, r: usize) -> Vec<u8> {
        if group > 1 {
            let (_, block) = self.ty().block();
            layout::row_of(data, row_bytes, block, group, r)
        } else {
            data[r * row_bytes..(r + 1) * row_bytes].to_vec()
        }
    }
}

/// The [`Kernel`] of a [`Quant`] type.
struct Typed<Q>(PhantomData<fn() -> Q>);

impl<Q: Quant> Kernel for Typed<Q>
where
    Q::Act: Wrap,
{
    fn ty(&self) -> GgmlType {
        Q::TYPE
    }

    fn quantize(
        &self,
        xs: &[f32],
        rows: usize,
        k: usize,
        paths: &[Path],
        par: ParFor<'_>,
    ) -> Result<AnyActivations, KernelError> {
        let gemm = |j: usize| paths.get(j) == Some(&Path::Gemm);
        Ok(Q::Act::wrap(Activations::quantize_par(
            xs, rows, k, gemm, par,
        )?))
    }

    fn matmul_range(
        &self,
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        group: Interleave,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let group = group.max(1);
        let Some(a) = checked::<Q>(w, row_bytes, group, act, &features, paths)? else {
            return Ok(());
        };
        let len = features.len();
        let rows = a.rows();
        if out.len() != rows * len {
            return Err(KernelError::Activations(format!(
                "output of {} values for {rows} rows × {len} features",
                out.len()
            )));
        }
        let (chunk, wgroup) = cache_blocks::<Q>(a, row_bytes, len);
        if group > 1 {
            for (g0, og) in features
                .clone()
                .step_by(wgroup)
                .zip(out.chunks_mut(wgroup * rows))
            {
                let g1 = (g0 + wgroup).min(features.end);
                for j0 in (0..rows).step_by(chunk) {
                    let j1 = (j0 + chunk).min(rows);
                    Q::vec_dot_block_in(
                        isa,
                        w,
                        row_bytes,
                        group,
                        g0..g1,
                        a,
                        j0..j1,
                        &mut og[j0..],
                        rows,
                    );
                }
            }
            return Ok(());
        }
        let w = &w[features.start * row_bytes..features.end * row_bytes];
        for (wg, og) in w
            .chunks(wgroup * row_bytes)
            .zip(out.chunks_mut(wgroup * rows))
        {
            for j0 in (0..rows).step_by(chunk) {
                let j1 = (j0 + chunk).min(rows);
                // Runs of rows on one path.
                let mut j = j0;
                while j < j1 {
                    let p = paths.get(j).copied().unwrap_or(Path::VecDot);
                    let mut e = j + 1;
                    while e < j1 && paths.get(e).copied().unwrap_or(Path::VecDot) == p {
                        e += 1;
                    }
                    if p == Path::VecDot {
                        Q::vec_dot_block(isa, wg, row_bytes, a, j..e, &mut og[j..], rows);
                    } else {
                        for (wr, o) in wg.chunks_exact(row_bytes).zip(og.chunks_exact_mut(rows)) {
                            Q::path_rows(isa, p, wr, a, j..e, &mut o[j..e]);
                        }
                    }
                    j = e;
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
        group: Interleave,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut RowsOut<'_>,
    ) -> Result<bool, KernelError> {
        // Rows on llama.cpp's repacked paths and on tinyBLAS have kernels of their own,
        // not `vec_dot`.
        if paths
            .iter()
            .any(|&p| matches!(p, Path::Gemm | Path::Gemv | Path::Sgemm))
        {
            return Ok(false);
        }
        let group = group.max(1);
        let Some(a) = checked::<Q>(w, row_bytes, group, act, &features, paths)? else {
            return Ok(true);
        };
        let rows = a.rows();
        let (chunk, wgroup) = cache_blocks::<Q>(a, row_bytes, features.len());
        for g0 in features.clone().step_by(wgroup) {
            let g1 = (g0 + wgroup).min(features.end);
            for j0 in (0..rows).step_by(chunk) {
                let j1 = (j0 + chunk).min(rows);
                if !Q::vec_dot_block_rows(isa, w, row_bytes, group, g0..g1, a, j0..j1, out) {
                    // Only ever the first call: the answer depends on `isa` alone.
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn dequantize_row(&self, row: &[u8], out: &mut [f32]) {
        for (b, o) in row
            .chunks_exact(Q::BLOCK_BYTES)
            .zip(out.chunks_exact_mut(Q::BLOCK_VALUES))
        {
            Q::dequantize_block(b, o);
        }
    }
}

/// The activations of a product of `features` with the stored rows `w`, checked
/// against the rows, `group` and `paths`; `None` when there are no activation rows.
fn checked<'a, Q: Quant>(
    w: &[u8],
    row_bytes: usize,
    group: Interleave,
    act: &'a AnyActivations,
    features: &Range<usize>,
    paths: &[Path],
) -> Result<Option<&'a Activations<Q::Act>>, KernelError>
where
    Q::Act: Wrap,
{
    let a = Q::Act::unwrap(act).ok_or_else(|| {
        KernelError::Activations(format!(
            "{} weights need {} activations",
            Q::TYPE.name(),
            Q::Act::NAME
        ))
    })?;
    let rows = a.rows();
    if rows == 0 {
        return Ok(None);
    }
    if features.end.div_ceil(group) * group * row_bytes > w.len() {
        return Err(KernelError::Activations(format!(
            "features {features:?} beyond the matrix"
        )));
    }
    if group > 1 && paths.iter().any(|&p| p != Path::VecDot) {
        return Err(KernelError::Activations(format!(
            "interleaved {} rows have only the vec_dot path",
            Q::TYPE.name()
        )));
    }
    if !paths.is_empty() && paths.len() != rows {
        return Err(KernelError::Activations(format!(
            "{} paths for {rows} activation rows",
            paths.len()
        )));
    }
    if a.k() / Q::BLOCK_VALUES * Q::BLOCK_BYTES != row_bytes {
        return Err(KernelError::Activations(format!(
            "rows of {} values do not match weight rows of {row_bytes} bytes",
            a.k()
        )));
    }
    Ok(Some(a))
}

/// Activation rows per chunk and weight rows per group of a product's cache blocking
/// (weight rows in groups of about 32 KiB, read from memory once, then from L1/L2 for
/// every chunk of activation rows; activation rows in chunks of whole tiles of about
/// 16 KiB, in L1 while the group's rows pass over them), for `a` and `len` features.
fn cache_blocks<Q: Quant>(a: &Activations<Q::Act>, row_bytes: usize, len: usize) -> (usize, usize) {
    let act_row_bytes =
        a.k() / Q::Act::BLOCK_VALUES * std::mem::size_of::<<Q::Act as ActFormat>::Block>();
    let chunk = (16384 / act_row_bytes.max(1) / TILE * TILE).clamp(TILE, 16 * TILE);
    // Weight rows per cache block. For fewer activation rows than a prefill tile
    // (decode) each weight row is read once anyway: one block, so that the decode
    // tiles' prefetch runs ahead across it.
    let wgroup = if a.rows() < layout::PREFILL_MIN {
        len.max(1)
    } else {
        (32768 / row_bytes.max(1)).clamp(1, 256)
    };
    (chunk, wgroup)
}

/// The kernel of an implemented type.
pub fn kernel_for(ty: GgmlType) -> &'static dyn Kernel {
    macro_rules! k {
        ($q:ty) => {{
            static K: Typed<$q> = Typed(PhantomData);
            &K
        }};
    }
    match ty {
        GgmlType::F32 => k!(crate::f32::F32Weights),
        GgmlType::F16 => k!(crate::f16::F16Weights),
        GgmlType::Bf16 => k!(crate::bf16::Bf16Weights),
        GgmlType::Q4_0 => k!(crate::q4_0::Q4_0),
        GgmlType::Q4_1 => k!(crate::q4_1::Q4_1),
        GgmlType::Q5_0 => k!(crate::q5_0::Q5_0),
        GgmlType::Q5_1 => k!(crate::q5_1::Q5_1),
        GgmlType::Q8_0 => k!(crate::q8_0::Q8_0),
        GgmlType::Q2K => k!(crate::q2_k::Q2K),
        GgmlType::Q3K => k!(crate::q3_k::Q3K),
        GgmlType::Q4K => k!(crate::q4_k::Q4K),
        GgmlType::Q5K => k!(crate::q5_k::Q5K),
        GgmlType::Q6K => k!(crate::q6_k::Q6K),
    }
}

/// A weight matrix `(n, k)` in its GGUF bytes (`n` rows of `k` values), for
/// `y = x · Wᵀ` with any implemented type's kernels.
pub struct QuantMatrix {
    kernel: &'static dyn Kernel,
    n: usize,
    k: usize,
    row_bytes: usize,
    /// Rows per interleaved group of `data` ([`Interleave`]; 1: ggml's layout).
    group: Interleave,
    data: Vec<u8>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QuantMatrix({}, {}×{})",
            self.kernel.ty().name(),
            self.n,
            self.k
        )
    }
}

impl QuantMatrix {
    /// A matrix of type `ty` from its bytes (`n` rows of `k` values, ggml layout).
    pub fn new(ty: GgmlType, data: Vec<u8>, n: usize, k: usize) -> Result<Self, KernelError> {
        let (values, _) = ty.block();
        if k == 0 || !k.is_multiple_of(values) {
            return Err(KernelError::RowLength {
                ty: ty.name(),
                k,
                block: values,
            });
        }
        let row_bytes = ty.row_bytes(k);
        if data.len() != n * row_bytes {
            return Err(KernelError::Bytes {
                ty: ty.name(),
                n,
                k,
                expected: n * row_bytes,
                got: data.len(),
            });
        }
        Ok(Self {
            kernel: kernel_for(ty),
            n,
            k,
            row_bytes,
            group: 1,
            data,
        })
    }

    /// [`Self::new`], the rows stored in the layout that `isa`'s kernels read fastest:
    /// Q4_K matrices that llama.cpp repacks in [`crate::q4_k_x16`]'s layout for AVX-512,
    /// Q6_K matrices in [`crate::q6_k_x16`]'s,
    /// Q5_0 and Q8_0 rows interleaved in groups of four for the AVX-512 block tiles
    /// ([`Interleave`]; those types run `vec_dot` on every path, so no other kernel
    /// reads their rows), ggml's layout otherwise. Products and dequantized rows are the
    /// same bits either way.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn for_isa(
        isa: Isa,
        ty: GgmlType,
        data: Vec<u8>,
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        let mut m = Self::new(ty, data, n, k)?;
        if isa == Isa::Avx512 && ty == GgmlType::Q4K && paths::repacked(ty, n) {
            // llama.cpp repacks these (gemm/gemv only): sixteen rows per register.
            m.data = crate::q4_k_x16::repack(&m.data, n, k / 256);
            m.group = crate::q4_k_x16::GROUP;
            m.kernel = &crate::x16_kernel::Q4K_X16;
            return Ok(m);
        }
        if isa == Isa::Avx512 && ty == GgmlType::Q6K {
            // vec_dot and tiled rows, sixteen rows per register.
            m.data = crate::q6_k_x16::repack(&m.data, n, k / 256);
            m.group = crate::q6_k_x16::GROUP;
            m.kernel = &crate::x16_kernel::Q6K_X16;
            return Ok(m);
        }
        let group = if isa == Isa::Avx512 && matches!(ty, GgmlType::Q5_0 | GgmlType::Q8_0) {
            4
        } else {
            1
        };
        if group > 1 {
            let (_, block) = ty.block();
            m.data = layout::interleave(&m.data, m.row_bytes, block, group);
            m.group = group;
        }
        Ok(m)
    }

    /// Rows per interleaved group of the stored bytes ([`Interleave`]): feature ranges
    /// handed to [`Self::matmul_range_paths`] are best whole groups.
    pub fn interleave(&self) -> Interleave {
        self.group
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.kernel.ty()
    }

    /// `(n, k)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The stored bytes: ggml's layout, or rows interleaved as [`Self::interleave`] says.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Converts `rows × k` activations to this type's activation format.
    pub fn quantize(&self, xs: &[f32], rows: usize) -> Result<AnyActivations, KernelError> {
        self.quantize_par(xs, rows, &[], &|n, f| (0..n).for_each(f))
    }

    /// llama.cpp's kernel for each activation row, from the rows' places in its
    /// micro-batches ([`paths::path`]).
    pub fn paths(&self, batch: &[BatchRow]) -> Vec<Path> {
        let ty = self.ty();
        batch
            .iter()
            .map(|&r| paths::path(ty, self.n, self.k, r))
            .collect()
    }

    /// Converts activations as [`Self::quantize`], row `j` as `paths[j]` quantizes it.
    pub fn quantize_for(
        &self,
        xs: &[f32],
        rows: usize,
        paths: &[Path],
    ) -> Result<AnyActivations, KernelError> {
        self.quantize_par(xs, rows, paths, &|n, f| (0..n).for_each(f))
    }

    /// [`Self::quantize_for`] with the rows converted in tasks run by `par`
    /// ([`act::Activations::quantize_par`]; the same blocks).
    pub fn quantize_par(
        &self,
        xs: &[f32],
        rows: usize,
        paths: &[Path],
        par: ParFor<'_>,
    ) -> Result<AnyActivations, KernelError> {
        self.kernel.quantize(xs, rows, self.k, paths, par)
    }

    /// Outputs for weight rows `features` (see [`Kernel::matmul_range`]); threads call
    /// this on disjoint ranges.
    pub fn matmul_range(
        &self,
        isa: Isa,
        act: &AnyActivations,
        features: Range<usize>,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_range_paths(isa, act, features, &[], out)
    }

    /// [`Self::matmul_range`] with activation row `j` on llama.cpp's kernel `paths[j]`
    /// (`paths` from [`Self::paths`]; activations from [`Self::quantize_for`]).
    pub fn matmul_range_paths(
        &self,
        isa: Isa,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.check_features(&features)?;
        self.kernel.matmul_range(
            isa,
            &self.data,
            self.row_bytes,
            self.group,
            act,
            features,
            paths,
            out,
        )
    }

    /// An error naming `features` where it reaches past the matrix's rows.
    fn check_features(&self, features: &Range<usize>) -> Result<(), KernelError> {
        if features.end > self.n {
            return Err(KernelError::Activations(format!(
                "features {features:?} beyond {} rows",
                self.n
            )));
        }
        Ok(())
    }

    /// [`Kernel::matmul_range_rows`] of this matrix: `Ok(false)`, nothing written, where
    /// its kernel has no row-major form for `isa` and `paths`.
    ///
    /// # Errors
    /// As [`Self::matmul_range_paths`].
    pub fn matmul_range_rows(
        &self,
        isa: Isa,
        act: &AnyActivations,
        features: Range<usize>,
        paths: &[Path],
        out: &mut RowsOut<'_>,
    ) -> Result<bool, KernelError> {
        self.check_features(&features)?;
        self.kernel.matmul_range_rows(
            isa,
            &self.data,
            self.row_bytes,
            self.group,
            act,
            features,
            paths,
            out,
        )
    }

    /// `x · Wᵀ` on the calling thread: `rows × n` outputs, row-major.
    pub fn matmul(&self, isa: Isa, xs: &[f32], rows: usize) -> Result<Vec<f32>, KernelError> {
        let act = self.quantize(xs, rows)?;
        let mut out_t = vec![0f32; rows * self.n];
        self.matmul_range(isa, &act, 0..self.n, &mut out_t)?;
        let mut out = vec![0f32; rows * self.n];
        for (r, col) in out_t.chunks_exact(rows.max(1)).enumerate() {
            for (j, &v) in col.iter().enumerate() {
                out[j * self.n + r] = v;
            }
        }
        Ok(out)
    }

    /// The dequantized rows `ids` (an embedding lookup): `ids.len() × k` values.
    pub fn dequantize_rows(&self, ids: &[u32]) -> Result<Vec<f32>, KernelError> {
        let mut out = vec![0f32; ids.len() * self.k];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.k)) {
            let r = id as usize;
            if r >= self.n {
                return Err(KernelError::RowId { id, n: self.n });
            }
            if self.group > 1 {
                let row = self
                    .kernel
                    .stored_row(&self.data, self.row_bytes, self.group, r);
                self.kernel.dequantize_row(&row, o);
            } else {
                self.kernel
                    .dequantize_row(&self.data[r * self.row_bytes..(r + 1) * self.row_bytes], o);
            }
        }
        Ok(out)
    }
}
