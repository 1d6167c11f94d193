//! `transfer_engine_bench`: upstream's transfer-engine benchmark on our engine. The code lives
//! in `mooncake_bench::engine` so the Python console script runs the same thing.

fn main() {
    std::process::exit(mooncake_bench::engine::bench_main(
        std::env::args().skip(1).collect(),
    ));
}
