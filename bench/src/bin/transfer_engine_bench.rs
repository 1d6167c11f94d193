//! `transfer_engine_bench`: upstream's transfer-engine benchmark on our engine. The code lives
//! in `dataplane::engine::bench` so the Python console script runs the same thing.

fn main() {
    std::process::exit(dataplane::engine::bench::bench_main(
        std::env::args().skip(1).collect(),
    ));
}
