//! Throughput of the EP dispatch's fp8 quantisation (`collective::ep::fp8::quantize_row`)
//! in each build this CPU runs (baseline x86-64 SSE2, AVX2, AVX-512; `quantize_row` takes the
//! widest), side by side with the per-element scalar loop they replaced (kept below as it
//! was, apart from its NaN sign) and with a plain copy of the bf16 row (what a bf16 dispatch
//! does with the same row instead).
//!
//! ```text
//! cargo run --release -p mooncake-bench --bin fp8_bench -- [--hidden 7168] [--tokens 128] [--rounds 5]
//! ```
//!
//! Each round quantises `--tokens` random rows (normal values, hidden `--hidden`) a number
//! of times and prints GB/s of bf16 input (`2 * hidden * tokens` bytes per pass) for each
//! way; the median of the rounds is printed last. Single thread, the buffers stay in cache
//! for small shapes (a dispatch quantises rows it has just read, so the same holds there).

use std::hint::black_box;
use std::time::Instant;

use collective::ep::fp8::{quantize_row, quantize_row_with, Build};

/// `--help`.
const USAGE: &str = "fp8_bench: fp8 quantisation GB/s, vectorised against scalar

fp8_bench [--hidden 7168] [--tokens 128] [--rounds 5]";

/// The quantiser before it was vectorised: a branchy conversion per element.
mod scalar {
    fn bf16_to_f32(h: u16) -> f32 {
        f32::from_bits((h as u32) << 16)
    }

    fn f32_to_e4m3(x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        if x.is_nan() {
            return 0x7f;
        }
        let a = x.abs();
        if a >= 448.0 {
            return sign | 0x7e;
        }
        if a < 1.0 / 64.0 {
            return sign | (a * 512.0).round_ties_even() as u8;
        }
        let b = a.to_bits();
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 7;
        let m = b & 0x7f_ffff;
        let mut r = (exp as u32) << 3 | (m >> 20);
        let rem = m & 0xf_ffff;
        if rem > 0x8_0000 || (rem == 0x8_0000 && r & 1 == 1) {
            r += 1;
        }
        sign | r.min(0x7e) as u8
    }

    pub fn quantize_row(src: &[u16], dst: &mut [u8]) {
        let h = src.len();
        let (q, scales) = dst.split_at_mut(h);
        for (g, (xs, qs)) in src
            .chunks_exact(128)
            .zip(q.chunks_exact_mut(128))
            .enumerate()
        {
            let amax = xs
                .iter()
                .fold(0f32, |m, &v| m.max(bf16_to_f32(v).abs()))
                .max(1e-4);
            let k = 448.0 / amax;
            for (d, &v) in qs.iter_mut().zip(xs) {
                *d = f32_to_e4m3(bf16_to_f32(v) * k);
            }
            scales[4 * g..4 * g + 4].copy_from_slice(&(amax / 448.0).to_le_bytes());
        }
    }
}

/// `--hidden`, `--tokens`, `--rounds`.
fn args() -> (usize, usize, usize) {
    let (mut hidden, mut tokens, mut rounds) = (7168usize, 128usize, 5usize);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| mooncake_bench::usage_error(format_args!("{a} wants a number")))
        };
        match a.as_str() {
            "--hidden" => hidden = value(),
            "--tokens" => tokens = value(),
            "--rounds" => rounds = value(),
            _ => mooncake_bench::usage_error(format_args!("unknown argument {a}")),
        }
    }
    if hidden == 0 || !hidden.is_multiple_of(128) || tokens == 0 || rounds == 0 {
        mooncake_bench::usage_error(
            "--hidden a positive multiple of 128, --tokens and --rounds > 0",
        );
    }
    (hidden, tokens, rounds)
}

fn main() {
    mooncake_bench::help(USAGE);
    let (hidden, tokens, rounds) = args();
    let src = random_rows(hidden * tokens);
    let rb = hidden + 4 * (hidden / 128);
    let mut dst = vec![0u8; rb * tokens];
    let mut copy = vec![0u16; hidden * tokens];
    // same bytes from both quantisers, apart from the scale's last bit (the scalar one
    // divided amax by 448) and NaN's sign: none here
    let mut check = vec![0u8; rb * tokens];
    run_rows(&src, &mut dst, hidden, quantize_row);
    run_rows(&src, &mut check, hidden, scalar::quantize_row);
    let same = dst
        .chunks_exact(rb)
        .zip(check.chunks_exact(rb))
        .all(|(a, b)| a[..hidden] == b[..hidden]);
    assert!(same, "vectorised and scalar fp8 bytes differ");
    let bytes = (2 * hidden * tokens) as f64;
    let passes = ((1usize << 30) / (2 * hidden * tokens)).max(1);
    println!("hidden {hidden}, {tokens} tokens, {passes} passes per round; GB/s of bf16 input");
    let builds: Vec<Build> = Build::ALL.into_iter().filter(|b| b.runs_here()).collect();
    let mut head: Vec<String> = vec!["round".into()];
    head.extend(builds.iter().map(|b| format!("{b:?}")));
    head.extend(["scalar".into(), "bf16 copy".into()]);
    let line = |cells: &[String]| {
        let rest: Vec<String> = cells[1..].iter().map(|c| format!("{c:>10}")).collect();
        println!("{:<8} {}", cells[0], rest.join(" "));
    };
    line(&head);
    let mut res: Vec<Vec<f64>> = vec![Vec::new(); builds.len() + 2];
    for r in 0..rounds {
        let mut row = Vec::new();
        for &b in &builds {
            row.push(time(passes, bytes, || {
                run_rows(&src, &mut dst, hidden, |s, d| quantize_row_with(b, s, d))
            }));
        }
        row.push(time(passes.div_ceil(8), bytes, || {
            run_rows(&src, &mut dst, hidden, scalar::quantize_row)
        }));
        row.push(time(passes, bytes, || {
            copy.copy_from_slice(black_box(&src))
        }));
        let mut cells = vec![r.to_string()];
        cells.extend(row.iter().map(|v| format!("{v:.2}")));
        line(&cells);
        for (xs, x) in res.iter_mut().zip(row) {
            xs.push(x);
        }
    }
    let m: Vec<f64> = res.iter_mut().map(|xs| median(xs)).collect();
    let mut cells = vec!["median".to_string()];
    cells.extend(m.iter().map(|v| format!("{v:.2}")));
    line(&cells);
    let scalar = m[builds.len()];
    for (b, v) in builds.iter().zip(&m) {
        println!("{b:?} / scalar: {:.1}x", v / scalar);
    }
    println!("quantize_row uses {:?}", Build::best());
}

fn run_rows(src: &[u16], dst: &mut [u8], hidden: usize, f: impl Fn(&[u16], &mut [u8])) {
    let rb = hidden + 4 * (hidden / 128);
    for (s, d) in src.chunks_exact(hidden).zip(dst.chunks_exact_mut(rb)) {
        f(black_box(s), d);
    }
    black_box(dst);
}

fn time(passes: usize, bytes: f64, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..passes {
        f();
    }
    bytes * passes as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Normal-ish bf16 values (a sum of uniforms), from a fixed xorshift seed.
fn random_rows(n: usize) -> Vec<u16> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            let mut u = 0f32;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                u += (s >> 40) as f32 / (1u64 << 24) as f32;
            }
            let x = (u - 2.0) * 1.7;
            (x.to_bits() >> 16) as u16
        })
        .collect()
}
