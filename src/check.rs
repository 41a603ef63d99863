use std::process::ExitCode;
pub fn main(_a: crate::cli::CheckArgs) -> anyhow::Result<ExitCode> {
    todo!()
}
