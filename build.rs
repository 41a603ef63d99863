//! Compile `proto/openshell.proto` and `proto/sandbox.proto` with protox (a pure-Rust protobuf
//! compiler), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/openshell.proto", "proto/sandbox.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Relay payloads are forwarded untouched; `Bytes` avoids a copy per frame.
        .bytes(".openshell.v1.RelayFrame")
        .bytes(".openshell.v1.ExecSandboxStdout")
        .bytes(".openshell.v1.ExecSandboxStderr")
        .compile_fds(fds)?;
    Ok(())
}
