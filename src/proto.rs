//! Placeholder: generated protobuf types land here.
