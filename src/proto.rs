//! Generated types for our wire-compatible `openshell.v1` subset (see `proto/openshell.proto`).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("openshell.v1");
}
