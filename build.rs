//! Compile `proto/openshell.proto` with protox (a pure-Rust protobuf compiler), so building needs
//! no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/openshell.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Relay payloads are forwarded untouched; `Bytes` avoids a copy per frame.
        .bytes(".openshell.v1.RelayFrame")
        .compile_fds(fds)?;
    Ok(())
}
