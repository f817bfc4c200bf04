//! The grammar of `args`: clap's own consistency check and how commands parse.

use super::*;
use clap::CommandFactory;

#[test]
fn grammar_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn exec_takes_name_and_command() {
    let cli = Cli::try_parse_from(["vm", "exec", "box", "--", "ls", "-l"]).unwrap();
    let Command::Exec(e) = cli.command else {
        panic!()
    };
    assert_eq!(e.name.as_deref(), Some("box"));
    assert_eq!(e.command, ["ls", "-l"]);
    let cli = Cli::try_parse_from(["vm", "exec", "--memory", "1G", "--", "sh", "-c", "x"]).unwrap();
    let Command::Exec(e) = cli.command else {
        panic!()
    };
    assert_eq!((e.name, e.vm.memory), (None, Some(1024)));
    // No command parses (a booting exec runs the image's Entrypoint + Cmd); `vm exec NAME`
    // without one is refused as a usage error when it runs (cli/tests: usage_errors_exit_2).
    let cli = Cli::try_parse_from(["vm", "exec", "box"]).unwrap();
    let Command::Exec(e) = cli.command else {
        panic!()
    };
    assert!(e.command.is_empty());
    let cli = Cli::try_parse_from(["vm", "exec", "-it", "box", "--", "sh"]).unwrap();
    let Command::Exec(e) = cli.command else {
        panic!()
    };
    assert!(e.interactive && e.tty);
    assert_eq!(e.name.as_deref(), Some("box"));
}
