//! Resolving the user a command runs as: `NAME`, `UID`, `NAME:GROUP` or `UID:GID` (the
//! forms of an OCI image config's `User`), looked up in the guest root's `/etc/passwd` and
//! `/etc/group`.
//!
//! The databases come from the guest image, so they are read with a size cap and parsed
//! leniently (a malformed line is skipped). A name that is not in the database is an error;
//! a numeric uid that is not in it runs with gid = uid and no supplementary groups (never
//! silently as group root). The result is resolved before `fork`, so switching identity in
//! the child needs no allocation.

use std::io::Read;
use std::path::Path;

/// Largest `/etc/passwd` or `/etc/group` read.
pub const MAX_DB_BYTES: u64 = 1 << 20;
/// Most supplementary groups taken from `/etc/group`.
pub const MAX_GROUPS: usize = 64;
/// Longest user string accepted.
pub const MAX_USER_LEN: usize = 256;

/// A resolved identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary gid first).
    pub groups: Vec<u32>,
}

/// User resolution errors; each names the user string.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UserError {
    #[error("user {0:?}: malformed (expected NAME, UID, NAME:GROUP or UID:GID)")]
    Malformed(String),
    #[error("user {user:?}: no {what} named {name:?} in the guest's /etc/{db}")]
    Unknown {
        user: String,
        what: &'static str,
        name: String,
        db: &'static str,
    },
}

/// One `/etc/passwd` entry: name, uid, gid.
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

/// One `/etc/group` entry: name, gid, members.
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

fn read_db(path: &Path) -> String {
    let Ok(f) = std::fs::File::open(path) else {
        return String::new();
    };
    let mut buf = Vec::new();
    let _ = f.take(MAX_DB_BYTES).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(PasswdEntry {
                name: (*f.first()?).to_string(),
                uid: f.get(2)?.parse().ok()?,
                gid: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(GroupEntry {
                name: (*f.first()?).to_string(),
                gid: f.get(2)?.parse().ok()?,
                members: f
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'))
}

/// Resolve `user` against `<etc>/passwd` and `<etc>/group`.
pub fn resolve(user: &str, etc: &Path) -> Result<Ids, UserError> {
    let malformed = || UserError::Malformed(user.chars().take(MAX_USER_LEN).collect());
    if user.len() > MAX_USER_LEN {
        return Err(malformed());
    }
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    if !valid_part(u) || g.is_some_and(|g| !valid_part(g)) {
        return Err(malformed());
    }
    let passwd = parse_passwd(&read_db(&etc.join("passwd")));
    let entry = match u.parse::<u32>() {
        Ok(uid) => passwd.iter().find(|e| e.uid == uid),
        Err(_) => Some(
            passwd
                .iter()
                .find(|e| e.name == u)
                .ok_or_else(|| UserError::Unknown {
                    user: user.into(),
                    what: "user",
                    name: u.into(),
                    db: "passwd",
                })?,
        ),
    };
    let uid = match entry {
        Some(e) => e.uid,
        None => u.parse().map_err(|_| malformed())?,
    };
    let groups_db = parse_group(&read_db(&etc.join("group")));
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups_db
                .iter()
                .find(|e| e.name == g)
                .map(|e| e.gid)
                .ok_or_else(|| UserError::Unknown {
                    user: user.into(),
                    what: "group",
                    name: g.into(),
                    db: "group",
                })?,
        },
        None => entry.map(|e| e.gid).unwrap_or(uid),
    };
    let mut groups = vec![gid];
    // Supplementary groups only when the group was not given explicitly (as docker does).
    if g.is_none()
        && let Some(e) = entry
    {
        for grp in groups_db.iter().filter(|grp| grp.members.contains(&e.name)) {
            if groups.len() >= MAX_GROUPS {
                break;
            }
            if !groups.contains(&grp.gid) {
                groups.push(grp.gid);
            }
        }
    }
    Ok(Ids { uid, gid, groups })
}

/// [`resolve`] against the agent's own `/etc` (the image root's, in a guest booted with
/// one); `None` stays `None`.
pub fn resolve_opt(user: Option<&str>) -> Result<Option<Ids>, UserError> {
    user.map(|u| resolve(u, Path::new("/etc"))).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etc() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("passwd"),
            "root:x:0:0:root:/root:/bin/sh\nbroken line\napp:x:1000:1001::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("group"),
            "root:x:0:\napp:x:1001:\nvideo:x:44:app,other\nstaff:x:50:other\n",
        )
        .unwrap();
        d
    }

    #[test]
    fn names_and_numbers_resolve() {
        let d = etc();
        let ids = resolve("app", d.path()).unwrap();
        assert_eq!((ids.uid, ids.gid, ids.groups), (1000, 1001, vec![1001, 44]));
        let ids = resolve("1000", d.path()).unwrap();
        assert_eq!((ids.uid, ids.gid), (1000, 1001));
        let ids = resolve("app:staff", d.path()).unwrap();
        assert_eq!((ids.uid, ids.gid, ids.groups), (1000, 50, vec![50]));
        let ids = resolve("4242:7", d.path()).unwrap();
        assert_eq!((ids.uid, ids.gid, ids.groups), (4242, 7, vec![7]));
        // A numeric uid unknown to passwd: gid = uid, never root's group.
        let ids = resolve("4242", d.path()).unwrap();
        assert_eq!((ids.uid, ids.gid), (4242, 4242));
    }

    #[test]
    fn unknown_and_malformed_are_refused() {
        let d = etc();
        let e = resolve("nobody", d.path()).unwrap_err();
        assert!(e.to_string().contains("no user named \"nobody\""), "{e}");
        let e = resolve("app:nogroup", d.path()).unwrap_err();
        assert!(e.to_string().contains("no group named"), "{e}");
        for bad in ["", ":", "a b", "app:", "a/b", &"x".repeat(300)] {
            assert!(
                matches!(resolve(bad, d.path()), Err(UserError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
