//! How a decision writes a row: the one rule for a layer weaker than asked.

use super::super::layer::{Enforcement, LayerStatus, PrepareError};

/// A row for a layer that is weaker than asked: an error unless degraded runs are allowed.
pub(super) fn degrade(
    allow_degraded: bool,
    layer: &'static str,
    reason: String,
    layers: &mut Vec<LayerStatus>,
) -> Result<(), PrepareError> {
    if !allow_degraded {
        return Err(PrepareError::NotEnforceable { layer, reason });
    }
    row(layers, layer, Enforcement::Degraded, reason);
    Ok(())
}

pub(super) fn row(
    layers: &mut Vec<LayerStatus>,
    layer: &'static str,
    status: Enforcement,
    detail: String,
) {
    layers.push(LayerStatus {
        layer,
        status,
        detail,
    });
}
