//! Generated types for our wire-compatible `openshell.v1` subset (see `proto/openshell.proto`)
//! and the policy plane's `openshell.sandbox.v1` (see `proto/sandbox.proto`).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("openshell.v1");
}

/// `openshell.sandbox.v1`: GetSandboxConfig and the SandboxPolicy tree. Decode policies with
/// `policy::openshell::decode_config_response`, never with prost alone: prost drops unknown
/// fields silently.
pub mod sandbox {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("openshell.sandbox.v1");
    }
}
