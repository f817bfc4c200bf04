//! `vm-kvm-proof --pack DIR --out DIR [--quick]`: the kvm proof's runner (see
//! `vm_tests::proof`); `DIR/run.sh` of a pack made by `ci/kvm-proof.sh pack` calls it.

fn main() {
    let code = match vm_tests::proof::Args::parse(std::env::args().skip(1)) {
        Ok(args) => vm_tests::proof::run(&args),
        Err(e) => {
            eprintln!("vm-kvm-proof: {e}\nusage: vm-kvm-proof --pack DIR --out DIR [--quick]");
            vm_tests::proof::report::Outcome::Broken.exit_code()
        }
    };
    std::process::exit(code);
}
