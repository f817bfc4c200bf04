//! `vm images import|pull|ls|rm|prune` for OCI images, through the built binary, against a
//! store in the test's own directory (`VM_OCI_DIR`).

mod common;
#[path = "../../oci/tests/common/mod.rs"]
mod oci_common;

use common::{Env, Out};
use oci_common::{TestImage, cannot_convert, have, registry::Registry, sample, tar_dir};

fn run(env: &Env, args: &[&str]) -> Out {
    Out::from(
        env.cmd()
            .env("VM_OCI_DIR", env.dir.path().join("oci"))
            .env("VM_IMAGES_DIR", env.dir.path().join("images"))
            .args(args)
            .output()
            .unwrap(),
    )
}

fn oci_entries(env: &Env) -> Vec<serde_json::Value> {
    let ls = run(env, &["images", "ls", "--json"]);
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    ls.json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "oci")
        .cloned()
        .collect()
}

fn digest_of(out: &Out) -> String {
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.json()["digest"].as_str().unwrap().to_owned()
}

#[test]
fn images_import_ls_rm_prune() {
    if let Some(why) = cannot_convert() {
        common::skip("images_import_ls_rm_prune", &why);
        return;
    }
    let env = Env::new();
    let img: TestImage = sample();
    let layout = env.dir.path().join("layout");
    img.write_layout(&layout, "1");
    let archive = env.dir.path().join("image.oci.tar");
    tar_dir(&layout, &archive);
    let saved = env.dir.path().join("image.docker.tar");
    img.write_docker_save(&saved, "example.com/team/sample:2");
    let p = |p: &std::path::Path| p.display().to_string();

    // ls and prune on a store that does not exist yet: empty, and nothing created.
    assert!(oci_entries(&env).is_empty());
    assert!(!env.dir.path().join("oci").exists());

    let out = run(
        &env,
        &[
            "images",
            "import",
            &p(&layout),
            "--name",
            "127.0.0.1:5000/s:1",
            "--json",
        ],
    );
    let d = digest_of(&out);
    assert_eq!(d, img.manifest_digest());
    assert!(std::path::Path::new(out.json()["erofs"].as_str().unwrap()).is_file());
    assert_eq!(out.json()["config"]["user"], "1000:1000");
    let out = run(&env, &["images", "import", &p(&archive), "--json"]);
    assert_eq!(digest_of(&out), d, "the oci-archive is the same image");
    let saved_digest = digest_of(&run(&env, &["images", "import", &p(&saved), "--json"]));

    let entries = oci_entries(&env);
    assert_eq!(entries.len(), 2);
    let text = run(&env, &["images", "ls"]);
    assert!(
        text.stdout.contains("127.0.0.1:5000/s:1") && text.stdout.contains(&d),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("example.com/team/sample:2"),
        "{}",
        text.stdout
    );

    let rm = run(&env, &["images", "rm", "127.0.0.1:5000/s:1"]);
    assert_eq!(rm.code, 0, "{}", rm.stderr);
    assert!(
        rm.stdout.contains("untagged 127.0.0.1:5000/s:1")
            && rm.stdout.contains(&format!("deleted {d}")),
        "{}",
        rm.stdout
    );
    assert_eq!(oci_entries(&env).len(), 1);

    // An unnamed import is what prune removes.
    digest_of(&run(&env, &["images", "import", &p(&layout), "--json"]));
    let pr = run(&env, &["images", "prune"]);
    assert_eq!(pr.code, 0, "{}", pr.stderr);
    assert!(pr.stdout.contains(&format!("removed {d}")), "{}", pr.stdout);
    let left = oci_entries(&env);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["digest"], saved_digest.as_str());

    let prefix = &saved_digest[7..19];
    let rm = run(&env, &["images", "rm", prefix]);
    assert_eq!(rm.code, 0, "{}", rm.stderr);
    assert!(oci_entries(&env).is_empty());

    let rm = run(&env, &["images", "rm", "127.0.0.1:5000/nope:1"]);
    assert_eq!(rm.code, 125);
    assert!(rm.stderr.contains("no image"), "{}", rm.stderr);
    let bad = run(&env, &["images", "import", "/nonexistent/image.tar"]);
    assert_eq!(bad.code, 125);
    assert!(
        bad.stderr.contains("/nonexistent/image.tar"),
        "{}",
        bad.stderr
    );
    let bad = run(
        &env,
        &["images", "import", &p(&layout), "--name", "Not A Ref"],
    );
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--name"), "{}", bad.stderr);
}

#[test]
fn images_pull_by_tag_and_digest() {
    let missing = ["docker-registry", "skopeo"].into_iter().find(|t| !have(t));
    if let Some(why) = cannot_convert().or(missing.map(|t| format!("{t} not installed"))) {
        common::skip("images_pull_by_tag_and_digest", &why);
        return;
    }
    let env = Env::new();
    let reg = Registry::start();
    let img = sample();
    let layout = env.dir.path().join("layout");
    img.write_layout(&layout, "1");
    reg.push(&layout, "1", "sample", true);

    let by_tag = format!("{}/sample:1", reg.addr);
    let d = digest_of(&run(&env, &["images", "pull", &by_tag, "--json"]));
    let by_digest = format!("{}/sample@{d}", reg.addr);
    let out = run(&env, &["images", "pull", &by_digest]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains(&d), "{}", out.stdout);
    let entries = oci_entries(&env);
    assert_eq!(entries.len(), 1);
    let refs: Vec<&str> = entries[0]["refs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(refs, [by_tag.as_str(), by_digest.as_str()]); // sorted

    let missing = run(&env, &["images", "pull", &format!("{}/absent:1", reg.addr)]);
    assert_eq!(missing.code, 125);
    assert!(
        missing.stderr.contains("fetching manifest"),
        "{}",
        missing.stderr
    );
    let bad = run(&env, &["images", "pull", "UPPER/Case:1"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}

#[test]
fn images_pull_reads_docker_config() {
    let missing = ["docker-registry", "skopeo"].into_iter().find(|t| !have(t));
    if let Some(why) = cannot_convert().or(missing.map(|t| format!("{t} not installed"))) {
        common::skip("images_pull_reads_docker_config", &why);
        return;
    }
    let Some(reg) = Registry::start_with_auth("u", "pw") else {
        common::skip(
            "images_pull_reads_docker_config",
            "python3 with the crypt module is needed to write the registry's bcrypt htpasswd",
        );
        return;
    };
    let env = Env::new();
    let layout = env.dir.path().join("layout");
    sample().write_layout(&layout, "1");
    reg.push_as(&layout, "1", "private", false, Some("u:pw"));
    let docker = env.dir.path().join("docker");
    std::fs::create_dir(&docker).unwrap();
    let pull = || {
        Out::from(
            env.cmd()
                .env("VM_OCI_DIR", env.dir.path().join("oci"))
                .env("DOCKER_CONFIG", &docker)
                .args(["images", "pull", &format!("{}/private:1", reg.addr)])
                .output()
                .unwrap(),
        )
    };
    let anon = pull();
    assert_eq!(anon.code, 125, "{}", anon.stderr);
    // "u:pw" in base64
    let cfg = format!(r#"{{"auths":{{"{}":{{"auth":"dTpwdw=="}}}}}}"#, reg.addr);
    std::fs::write(docker.join("config.json"), cfg).unwrap();
    let ok = pull();
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}
