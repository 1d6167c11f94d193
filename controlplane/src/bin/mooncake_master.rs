//! `mooncake_master`: the control-plane master. See `controlplane::cli`.

fn main() {
    std::process::exit(controlplane::cli::master_main(
        std::env::args().skip(1).collect(),
    ));
}
