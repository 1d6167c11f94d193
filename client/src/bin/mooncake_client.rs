//! `mooncake_client`: a storage node contributing memory to a Mooncake store (upstream's
//! standalone memory provider), with `--shards` shared-nothing shards. The program lives in
//! `client::cli::node_main` so the Python console script runs the same code.

fn main() {
    std::process::exit(client::cli::node_main(std::env::args().skip(1).collect()));
}
