//! `tpm-vault completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::error::CliError;
use super::{files, Cli, Context};

/// `tpm-vault completions`.
#[derive(Debug, Args)]
#[command(after_help = "Example: tpm-vault completions bash > /etc/bash_completion.d/tpm-vault")]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum, value_name = "SHELL")]
    pub(crate) shell: Shell,
}

impl CompletionsArgs {
    pub(crate) fn run(self, _ctx: &mut Context) -> Result<(), CliError> {
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut Cli::command(), "tpm-vault", &mut script);
        files::write_stdout(&script)
    }
}
