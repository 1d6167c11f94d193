//! `mooncake_http_metadata_server`: the HTTP metadata store alone. See
//! `controlplane::http::metadata_main`.

fn main() {
    std::process::exit(controlplane::http::metadata_main(
        std::env::args().skip(1).collect(),
    ));
}
