//! [`MissingInterpreter`]: a program in the view whose interpreter is not, and its message;
//! found by `explain.rs`, carried by [`RunError::InterpreterNotFound`](super::RunError).

use std::path::PathBuf;

/// The program is in the view, but an interpreter it needs is not
/// ([`RunError::InterpreterNotFound`]).
#[derive(Debug)]
pub struct MissingInterpreter {
    pub program: PathBuf,
    /// The file that names the interpreter: the program, or an interpreter of it.
    pub holder: PathBuf,
    pub interpreter: PathBuf,
    /// Named as ELF `PT_INTERP` (else on a `#!` line).
    pub elf: bool,
    /// The first component of the interpreter's path that does not exist in the view.
    pub missing: PathBuf,
    /// Where the interpreter's path led, through the links the view holds.
    pub leads_to: PathBuf,
    /// The directory to grant.
    pub grant: PathBuf,
}

impl std::fmt::Display for MissingInterpreter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&interpreter_message(self))
    }
}

fn interpreter_message(m: &MissingInterpreter) -> String {
    let MissingInterpreter {
        program,
        holder,
        interpreter,
        elf,
        missing,
        leads_to,
        grant,
    } = m;
    let (p, i) = (program.display(), interpreter.display());
    let mut notes = Vec::new();
    let head = match (holder == program, *elf) {
        (true, true) => {
            format!("{p}: cannot start: its ELF interpreter {i} is not in the sandbox's view")
        }
        (true, false) => {
            notes.push("named on its `#!` line".to_string());
            format!("{p}: bad interpreter: {i} not found in the sandbox's view")
        }
        (false, elf) => format!(
            "{p}: cannot start: the {} interpreter {i} of {}, which it needs, is not in the sandbox's view",
            if elf { "ELF" } else { "`#!`" },
            holder.display()
        ),
    };
    if leads_to != interpreter {
        notes.push(format!("it leads to {}", leads_to.display()));
    }
    if missing != interpreter {
        notes.push(format!("{} does not exist there", missing.display()));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    let g = grant.display();
    format!("{head}{notes}; grant {g} to add it (`--ro {g}`, or read_only in the policy)")
}
