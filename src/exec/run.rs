use std::process::ExitCode;
pub fn main(_a: crate::cli::RunArgs) -> anyhow::Result<ExitCode> {
    todo!()
}
