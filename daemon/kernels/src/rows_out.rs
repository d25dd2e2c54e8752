//! [`RowsOut`]: where a product's outputs go when a kernel writes them row-major
//! ([`crate::Kernel::matmul_range_rows`]): activation row `j`'s outputs for the weight
//! rows (output features) `cols` of a `(rows, n)` row-major matrix.

use std::mem::MaybeUninit;
use std::ops::Range;

use crate::team::ColumnBlock;

/// The outputs `(j, f)` for `j < rows` and `f` in `cols` of a row-major matrix with
/// rows of `ld` values, borrowed exclusively: a column block of the team's output
/// ([`ColumnBlock`]) or a whole `rows × cols.len()` buffer ([`RowsOut::new`]).
pub struct RowsOut<'a> {
    /// Output `(0, cols.start)`.
    base: *mut f32,
    /// Values from one row to the next.
    ld: usize,
    rows: usize,
    cols: Range<usize>,
    _data: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> RowsOut<'a> {
    /// `data` as the `rows × cols.len()` outputs of the features `cols`, row-major.
    ///
    /// # Panics
    /// If `data` does not hold `rows · cols.len()` values.
    pub fn new(data: &'a mut [f32], rows: usize, cols: Range<usize>) -> Self {
        assert_eq!(data.len(), rows * cols.len(), "{rows} rows × {cols:?}");
        Self {
            base: data.as_mut_ptr(),
            ld: cols.len(),
            rows,
            cols,
            _data: std::marker::PhantomData,
        }
    }

    /// The columns of `block` (every output of them is to be written).
    pub fn of_block(block: &'a mut ColumnBlock<'_, MaybeUninit<f32>>) -> Self {
        let (base, ld, rows, cols) = block.raw_parts();
        Self {
            base: base.cast::<f32>(),
            ld,
            rows,
            cols,
            _data: std::marker::PhantomData,
        }
    }

    /// Activation rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The output features held.
    pub fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }

    /// Row `j`'s outputs for the features `f .. f + values.len()`.
    ///
    /// # Panics
    /// If they are not all held.
    #[inline]
    pub fn put(&mut self, j: usize, f: usize, values: &[f32]) {
        assert!(
            j < self.rows && f >= self.cols.start && f + values.len() <= self.cols.end,
            "row {j}, features {f}..{} outside {} rows × {:?}",
            f + values.len(),
            self.rows,
            self.cols
        );
        // SAFETY: inside the borrowed outputs (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                self.base.add(j * self.ld + f - self.cols.start),
                values.len(),
            );
        }
    }

    /// The address of output `(j, f)` and the distance (in values) from one row to the
    /// next, for kernels that write outputs one at a time.
    ///
    /// # Panics
    /// If `(j, f)` is not held.
    #[inline]
    pub(crate) fn at(&mut self, j: usize, f: usize) -> (*mut f32, usize) {
        assert!(
            j < self.rows && self.cols.contains(&f),
            "output ({j}, {f}) outside {} rows × {:?}",
            self.rows,
            self.cols
        );
        // SAFETY: inside the borrowed outputs (checked above).
        (
            unsafe { self.base.add(j * self.ld + f - self.cols.start) },
            self.ld,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_land_row_major_and_out_of_range_panics() {
        let mut v = vec![0f32; 3 * 4];
        let mut o = RowsOut::new(&mut v, 3, 10..14);
        o.put(1, 11, &[1.0, 2.0]);
        o.put(2, 13, &[3.0]);
        assert_eq!(v, [0., 0., 0., 0., 0., 1., 2., 0., 0., 0., 0., 3.]);
        let mut o = RowsOut::new(&mut v, 3, 10..14);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| o.put(0, 13, &[1., 1.])));
        assert!(r.is_err());
    }

    /// The 32-value signed types' row-major form gives the bits of their weight-row
    /// major products (decode and prefill tiles, feature ranges that cut interleaved
    /// groups), and declines rows on llama.cpp's repacked paths.
    #[test]
    fn legacy_rows_equal_the_weight_row_major_products() {
        use crate::paths::BatchRow;
        use crate::{GgmlType, Isa, Path, QuantMatrix};
        use candle_core::quantized::GgmlDType;
        let (n, k) = (37, 96);
        for (ty, dtype) in [
            (GgmlType::Q8_0, GgmlDType::Q8_0),
            (GgmlType::Q5_0, GgmlDType::Q5_0),
            (GgmlType::Q4_0, GgmlDType::Q4_0),
        ] {
            let w = crate::testing::random(n * k, 5);
            let (bytes, _) = crate::testing::quantize(&w, n, k, dtype);
            for isa in Isa::available() {
                let m = QuantMatrix::for_isa(isa, ty, bytes.clone(), n, k).expect("matrix");
                for rows in [1, 3, 4, 13, 40] {
                    let xs = crate::testing::random(rows * k, 7);
                    let a = m.quantize_for(&xs, rows, &[]).expect("act");
                    for f in [0..n, 5..30, 17..18] {
                        let mut u = vec![0f32; rows * f.len()];
                        m.matmul_range_paths(isa, &a, f.clone(), &[], &mut u)
                            .expect("weight-row major");
                        let mut v = vec![f32::NAN; rows * f.len()];
                        let done = m
                            .matmul_range_rows(
                                isa,
                                &a,
                                f.clone(),
                                &[],
                                &mut RowsOut::new(&mut v, rows, f.clone()),
                            )
                            .expect("row-major");
                        assert_eq!(done, isa == Isa::Avx512, "{ty:?} {isa:?}");
                        if !done {
                            continue;
                        }
                        for (c, col) in u.chunks_exact(rows).enumerate() {
                            for (j, x) in col.iter().enumerate() {
                                assert_eq!(
                                    x.to_bits(),
                                    v[j * f.len() + c].to_bits(),
                                    "{ty:?} {rows} rows, features {f:?}: ({j}, {c})"
                                );
                            }
                        }
                    }
                }
                // Q4_0's gemm rows (llama.cpp repacks its matrices of 8n rows): no
                // row-major form here.
                let m =
                    QuantMatrix::for_isa(isa, ty, bytes[..bytes.len() / n * 16].to_vec(), 16, k)
                        .expect("16 rows");
                let batch: Vec<_> = (0..8).map(|i| BatchRow { index: i, len: 8 }).collect();
                let paths = m.paths(&batch);
                let xs = crate::testing::random(8 * k, 7);
                let a = m.quantize_for(&xs, 8, &paths).expect("act");
                let mut v = vec![0f32; 8 * 8];
                let done = m
                    .matmul_range_rows(isa, &a, 0..8, &paths, &mut RowsOut::new(&mut v, 8, 0..8))
                    .expect("rows");
                let repacked = paths.contains(&Path::Gemm);
                assert_eq!(repacked, ty == GgmlType::Q4_0, "{paths:?}");
                assert_eq!(done, isa == Isa::Avx512 && !repacked, "{ty:?} {isa:?}");
            }
        }
    }
}
