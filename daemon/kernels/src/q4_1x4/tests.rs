use super::*;
use candle_core::quantized::QMatMul;
use candle_core::Module;
use candle_core::{DType, Device};

fn random(shape: (usize, usize), seed: u64) -> Tensor {
    // Deterministic xorshift values in [-1, 1), with a few larger outliers.
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let data: Vec<f32> = (0..shape.0 * shape.1)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 40) as f32 / (1u64 << 24) as f32;
            let v = 2.0 * u - 1.0;
            if i % 97 == 0 {
                4.0 * v
            } else {
                v
            }
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// Asserts `a` and `b` have the same shape and bit-identical values.
fn assert_same_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}");
    let av = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let bv = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for (i, (x, y)) in av.iter().zip(&bv).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{what}: element {i}: {x:e} vs {y:e}"
        );
    }
}

/// The candle-order kernels (bit-exact with candle).
fn kernels() -> Vec<Kernel> {
    vec![Kernel::Scalar]
}

/// The ggml-order kernels this CPU runs (the serving default).
fn ggml_kernels() -> Vec<Kernel> {
    let mut k = vec![Kernel::GgmlScalar];
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        k.push(Kernel::GgmlAvx2);
        if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
            k.push(Kernel::GgmlVnni);
        }
    }
    if !k.contains(&Kernel::detect()) {
        k.push(Kernel::detect());
    }
    k
}

/// Our forward vs candle's portable Q4_1 `QMatMul`: same Q8_1 activations, same
/// integer dot products and the same f32 operations in the same order, so every
/// kernel must give exactly candle's bits.
#[test]
fn matches_candle_qmatmul_and_f32_reference() {
    for (si, &(n, k)) in [(192, 576), (1536, 576), (576, 1536), (8, 64), (7, 192)]
        .iter()
        .enumerate()
    {
        let w = random((n, k), 1 + si as u64);
        let qt = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let wdq = qt.dequantize(&Device::Cpu).unwrap();
        let ours = Q4_1Matrix::from_qtensor(&qt).unwrap();
        assert_eq!(ours.shape(), (n, k));
        let candle = QMatMul::from_qtensor(qt).unwrap();
        for m in [1usize, 3, 37] {
            let x = random((m, k), 100 + m as u64 + 7 * si as u64);
            let want = candle.forward(&x).unwrap();
            let reference = x.matmul(&wdq.t().unwrap()).unwrap();
            for kernel in kernels().into_iter().chain(ggml_kernels()) {
                let got = ours.forward_with(&x, kernel).unwrap();
                assert_eq!(got.dims(), &[m, n]);
                if kernels().contains(&kernel) {
                    assert_same_bits(&got, &want, &format!("({n},{k}) m={m} {kernel:?}"));
                }
                // Against the f32 product with the dequantized weights, the only
                // error is the Q8_1 rounding of x: |Δx_i| ≤ d8/2 per value (plus
                // the f16 rounding of d8 and s), so |Δy| ≤ Σ_b (d8_b/2 + 2⁻¹¹·amax_b)
                // · Σ_i |w_i| summed per block.
                let xv = x.to_vec2::<f32>().unwrap();
                let wv = wdq.to_vec2::<f32>().unwrap();
                let gv = got.to_vec2::<f32>().unwrap();
                let rv = reference.to_vec2::<f32>().unwrap();
                for a in 0..m {
                    for r in 0..n {
                        let mut bound = 0f32;
                        for b in 0..k / QK {
                            let xb = &xv[a][b * QK..(b + 1) * QK];
                            let amax = xb.iter().fold(0f32, |acc, v| acc.max(v.abs()));
                            let wsum: f32 =
                                wv[r][b * QK..(b + 1) * QK].iter().map(|v| v.abs()).sum();
                            bound += (amax / 127.0 * 0.5 + amax / 1024.0) * wsum;
                        }
                        let err = (gv[a][r] - rv[a][r]).abs();
                        assert!(
                            err <= bound * 1.01 + 1e-5,
                            "({n},{k}) m={m} [{a},{r}]: |{} - {}| > {bound}",
                            gv[a][r],
                            rv[a][r]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batched_leading_dims_and_non_contiguous_input() {
    // candle's portable Q4_1 kernel debug-asserts an even block count.
    let (n, k) = (64, 128);
    let qt = QTensor::quantize(&random((n, k), 5), GgmlDType::Q4_1).unwrap();
    let ours = Q4_1Matrix::from_qtensor(&qt).unwrap();
    let candle = QMatMul::from_qtensor(qt).unwrap();
    let x = random((6, k), 9).reshape((2, 3, k)).unwrap();
    let got = ours.forward_with(&x, Kernel::Scalar).unwrap();
    assert_eq!(got.dims(), &[2, 3, n]);
    let want = candle.forward(&x).unwrap();
    assert_same_bits(&got, &want, "batched");
    // A transposed (non-contiguous) input is made contiguous first.
    let xt = random((k, 5), 11).t().unwrap();
    assert!(!xt.is_contiguous());
    let got = ours.forward_with(&xt, Kernel::Scalar).unwrap();
    let want = candle.forward(&xt.contiguous().unwrap()).unwrap();
    assert_same_bits(&got, &want, "transposed");
    // 1-D input: a single row.
    let x1 = random((1, k), 12).flatten_all().unwrap();
    let got = ours.forward(&x1).unwrap();
    assert_eq!(got.dims(), &[n]);
}

#[test]
fn scalar_and_simd_kernels_agree() {
    // Every tile shape (m = 1; odd n; m % 4 != 0; several activation tiles) with
    // the parallel split, and block counts that are whole groups of 8 (8, 48), have a
    // partial last group (18, 17, 23) or only a partial group (1, 3, 7). candle's
    // kernel does not accept odd block counts, so these compare with our scalar
    // kernel, itself checked bit-exact against candle above.
    for &(n, k) in &[
        (1537usize, 576usize),
        (33, 96),
        (67, 256),
        (9, 32),
        (130, 224),
        (65, 544),
        (31, 736),
        (37, 1536),
    ] {
        let qt = QTensor::quantize(&random((n, k), 21 + k as u64), GgmlDType::Q4_1).unwrap();
        let ours = Q4_1Matrix::from_qtensor(&qt).unwrap();
        for m in [1usize, 2, 5, 70, 131] {
            let x = random((m, k), 30 + m as u64);
            let what = format!("({n},{k}) m={m}");
            let scalar = ours.forward_with(&x, Kernel::Scalar).unwrap();
            for kernel in kernels() {
                assert_same_bits(&ours.forward_with(&x, kernel).unwrap(), &scalar, &what);
            }
            let ggml = ours.forward_with(&x, Kernel::GgmlScalar).unwrap();
            assert_same_bits(&ours.forward(&x).unwrap(), &ggml, &what);
            for kernel in ggml_kernels() {
                assert_same_bits(&ours.forward_with(&x, kernel).unwrap(), &ggml, &what);
            }
        }
    }
}

#[test]
fn q8_1_quantization_kernels_agree() {
    // The AVX2 build of the quantizer against the portable one, bit for bit, on
    // rows with zeros, ties at .5 and large magnitudes.
    let k = 32 * 24;
    let rows = 20;
    let mut xs = random((rows, k), 8)
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    for (i, v) in xs.iter_mut().enumerate() {
        match i % 211 {
            0..=31 => *v = 0.0,
            40 => *v *= 1e4,
            41 => *v = 0.5,
            42 => *v = -2.5,
            _ => {}
        }
    }
    for (reference, family) in [
        (Kernel::Scalar, kernels()),
        (Kernel::GgmlScalar, ggml_kernels()),
    ] {
        let want = quantize_q8_1(&xs, rows, k, reference);
        for kernel in family {
            let got = quantize_q8_1(&xs, rows, k, kernel);
            for b in 0..rows * k / QK {
                assert_eq!(got.d[b].to_bits(), want.d[b].to_bits(), "d {b}");
                assert_eq!(got.s[b].to_bits(), want.s[b].to_bits(), "s {b}");
                assert_eq!(got.qs[b].0, want.qs[b].0, "q {b}");
            }
        }
    }
    // ggml rounds x · (127 / amax) half to even: 0.5 → 0, -2.5 → -2 when the block's
    // amax is 127 (candle rounds half away from zero: 1 and -3).
    let mut x = vec![0f32; QK];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = -2.5;
    let g = quantize_q8_1(&x, 1, QK, Kernel::GgmlScalar);
    let c = quantize_q8_1(&x, 1, QK, Kernel::Scalar);
    assert_eq!((g.qs[0].0[1], g.qs[0].0[2]), (0, -2));
    assert_eq!((c.qs[0].0[1], c.qs[0].0[2]), (1, -3));
}

#[test]
fn q8_1_quantization_matches_candle_bits() {
    // candle's Q8_1 blocks for the same values, read back through its raw data.
    let k = 256;
    let x = random((3, k), 42);
    let x = (x * 3.0).unwrap();
    let q = QTensor::quantize(&x, GgmlDType::Q8_1).unwrap();
    let raw = q.data().unwrap();
    let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for kernel in kernels() {
        let act = quantize_q8_1(&xs, 3, k, kernel);
        for (bi, block) in raw.chunks_exact(36).enumerate() {
            let d = f16_bits_to_f32(u16::from_le_bytes([block[0], block[1]]));
            let s = f16_bits_to_f32(u16::from_le_bytes([block[2], block[3]]));
            assert_eq!(d.to_bits(), act.d[bi].to_bits(), "d of block {bi}");
            assert_eq!(s.to_bits(), act.s[bi].to_bits(), "s of block {bi}");
            for j in 0..QK {
                assert_eq!(block[4 + j] as i8, act.qs[bi].0[j], "q {bi}/{j}");
            }
        }
    }
}

#[test]
fn f16_conversions_match_candle() {
    // Every f16 bit pattern → f32.
    let bits: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let t = Tensor::from_raw_buffer(&bits, DType::F16, &[1 << 16], &Device::Cpu).unwrap();
    let f = t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    for (h, want) in (0..=u16::MAX).zip(&f) {
        let got = f16_bits_to_f32(h);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{h:#06x}"
        );
    }
    // f32 → f16 on values around every rounding boundary and range edge.
    let mut vals: Vec<f32> = vec![0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e-8, 3e-8, 6e-8];
    let mut state = 7u32;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        // Finite exponents from 2^-30 to 2^17, random mantissas.
        let exp = 97 + (state >> 27) % 48;
        vals.push(f32::from_bits((state & 0x807f_ffff) | (exp << 23)));
    }
    for h in 0..0x7bffu16 {
        let v = f16_bits_to_f32(h);
        let next = f16_bits_to_f32(h + 1);
        vals.push((v + next) / 2.0); // exact tie
        vals.push(f32::from_bits(((v + next) / 2.0).to_bits() + 1));
    }
    let t = Tensor::from_vec(vals.clone(), vals.len(), &Device::Cpu).unwrap();
    let h = t
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    for (v, want) in vals.iter().zip(h.to_vec1::<f32>().unwrap()) {
        assert_eq!(f16_round(*v).to_bits(), want.to_bits(), "{v:e}");
    }
}

#[test]
fn bad_inputs_are_errors() {
    // k not a multiple of 32.
    assert!(Q4_1Matrix::from_ggml_bytes(&[0u8; 40], 1, 40).is_err());
    // Wrong data size.
    assert!(Q4_1Matrix::from_ggml_bytes(&[0u8; 39], 1, 64).is_err());
    // Wrong dtype.
    let w = random((4, 64), 3);
    let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
    assert!(Q4_1Matrix::from_qtensor(&q8).is_err());
    // Not 2-D.
    let w3 = w.reshape((2, 2, 64)).unwrap();
    let q3 = QTensor::quantize(&w3, GgmlDType::Q4_1).unwrap();
    assert!(Q4_1Matrix::from_qtensor(&q3).is_err());
    // x last dim ≠ k, wrong dtype, scalar.
    let ours = Q4_1Matrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4_1).unwrap()).unwrap();
    assert!(ours.forward(&random((2, 63), 1)).is_err());
    assert!(ours.forward(&random((2, 96), 1)).is_err());
    assert!(ours.forward(&random((2, 64), 1).t().unwrap()).is_err());
    let x16 = random((2, 64), 1).to_dtype(DType::F16).unwrap();
    assert!(ours.forward(&x16).is_err());
    assert!(ours
        .forward(&Tensor::new(1f32, &Device::Cpu).unwrap())
        .is_err());
    // Zero rows is fine.
    let empty = Tensor::zeros((0, 64), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(ours.forward(&empty).unwrap().dims(), &[0, 4]);
}

/// Mean ns per call of `f`, over about 0.3 s after a warm-up.
fn time_ns(mut f: impl FnMut()) -> f64 {
    let start = std::time::Instant::now();
    f();
    let once = start.elapsed().as_nanos().max(1);
    let iters = (300_000_000 / once).clamp(3, 20_000) as u32;
    for _ in 0..iters / 10 + 1 {
        f();
    }
    let start = std::time::Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(iters)
}

/// `cargo test -p inferd --release --lib model::q4_1::tests::timing -- --ignored --nocapture`
#[test]
#[ignore]
fn timing() {
    // Streaming: a 40 MB matrix (more than L2, as a decode step's weights), one
    // activation row, kernel only, single thread vs the team.
    let (n, k) = (110_000usize, 576usize);
    let data: Vec<u8> = (0..n * k / 32 * 20)
        .map(|i| (i * 7 % 251) as u8 & 0x3b)
        .collect();
    let w = Q4_1Matrix::from_ggml_bytes(&data, n, k).unwrap();
    let xs: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
    let act = quantize_q8_1(&xs, 1, k, Kernel::detect());
    let mut out = vec![0f32; n.div_ceil(4) * 4];
    let bytes = (n * k / 32 * 20) as f64;
    let t_one = time_ns(|| w.rows_range(&act, 0, &mut out, Kernel::detect()));
    let t2 = time_ns(|| {
        std::hint::black_box(w.matmul(&act, Kernel::detect()));
    });
    // A decode step's shapes: 30 layers of qkv (960, 576), o (576, 576), gate/up
    // (3072, 576), down (576, 1536), each its own allocation.
    let shapes = [(960usize, 576usize), (576, 576), (3072, 576), (576, 1536)];
    let mats: Vec<Q4_1Matrix> = (0..30 * 4)
        .map(|i| {
            let (n, k) = shapes[i % 4];
            let data: Vec<u8> = (0..n * k / 32 * 20)
                .map(|j| ((i + j) * 7 % 251) as u8 & 0x3b)
                .collect();
            Q4_1Matrix::from_ggml_bytes(&data, n, k).unwrap()
        })
        .collect();
    let total: usize = mats.iter().map(|m| m.n * m.k / 32 * 20).sum();
    let rows: usize = std::env::var("TIMING_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let xs: Vec<f32> = (0..1536 * rows).map(|i| (i as f32 * 0.37).sin()).collect();
    let acts: Vec<Q8_1Rows> = [576usize, 1536]
        .iter()
        .map(|&k| quantize_q8_1(&xs[..k * rows], rows, k, Kernel::detect()))
        .collect();
    let t = time_ns(|| {
        for m in &mats {
            let a = if m.k == 576 { &acts[0] } else { &acts[1] };
            std::hint::black_box(m.matmul(a, Kernel::detect()));
        }
    });
    let t1 = time_ns(|| {
        for m in &mats {
            let a = if m.k == 576 { &acts[0] } else { &acts[1] };
            let mut out = vec![0f32; m.n.div_ceil(4) * 4 * rows];
            m.rows_range(a, 0, &mut out, Kernel::detect());
            std::hint::black_box(out);
        }
    });
    println!(
        "decode-step shapes ({} MB in 120 matrices), {rows} rows: team {:.2} GB/s ({:.0} us), 1 thread {:.2} GB/s",
        total / 1_000_000,
        total as f64 / t,
        t / 1e3,
        total as f64 / t1
    );
    println!(
        "({n},{k}) m=1 kernel: 1 thread {:.2} GB/s ({:.2} ns/block), team of {} {:.2} GB/s",
        bytes / t_one,
        t_one / (n * k / 32) as f64,
        team::threads(),
        bytes / t2
    );
    for &(n, k) in &[(1536usize, 576usize), (576, 1536), (192, 576)] {
        let w = random((n, k), 77);
        let q41 = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let ours = Q4_1Matrix::from_qtensor(&q41).unwrap();
        let wdq = q41.dequantize(&Device::Cpu).unwrap();
        let candle41 = QMatMul::from_qtensor(q41).unwrap();
        let q80 = QTensor::quantize(&wdq, GgmlDType::Q8_0).unwrap();
        let candle80 = QMatMul::from_qtensor(q80).unwrap();
        for m in [1usize, 8, 128] {
            let x = random((m, k), 5);
            let t_ours = time_ns(|| {
                ours.forward(&x).unwrap();
            });
            let t_scalar = time_ns(|| {
                ours.forward_with(&x, Kernel::Scalar).unwrap();
            });
            let t41 = time_ns(|| {
                candle41.forward(&x).unwrap();
            });
            let t80 = time_ns(|| {
                candle80.forward(&x).unwrap();
            });
            println!(
                "({n:4},{k:4}) m={m:3}: q4_1 {kernel:?} {t_ours:9.0} ns | ours scalar {t_scalar:9.0} ns | candle Q4_1 {t41:9.0} ns | candle Q8_0 {t80:9.0} ns | threads {}",
                team::threads(),
                kernel = Kernel::detect(),
            );
        }
    }
}
