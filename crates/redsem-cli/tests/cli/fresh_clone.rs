//! What a new user still trips on: a stray word before `--`, `status` of a name
//! without permits, a port out of range, and `redsem` alone.

use crate::support::{World, bare, finish};

#[test]
fn a_word_before_the_dashes_is_a_usage_error_naming_it_never_the_command() {
    let world = World::new();
    let out = world
        .run(&[
            "run", "demo", "--limit", "2", "--lease", "3", "parsecs", "--", "true",
        ])
        .expect(125);
    assert!(out.error().contains("'parsecs' before '--'"), "{out:?}");
    // A stray word that names a command that would run: it is not run.
    let marker = world.path("touched");
    let marker = marker.to_str().expect("a UTF-8 path");
    for sub in [
        &["run", "demo", "--limit", "2"][..],
        &["lock", "demo", "-n"],
    ] {
        let mut args = sub.to_vec();
        args.extend(["touch", marker, "--", "true"]);
        let out = world.run(&args).expect(125);
        assert!(out.error().contains("'touch' before '--'"), "{out:?}");
        assert!(!std::path::Path::new(marker).exists(), "{args:?} ran touch");
    }
    // Before `--` only options; after it anything, `--` included; without it the first word
    // that is no option starts the command.
    world
        .run(&[
            "lock",
            "demo",
            "--",
            "sh",
            "-c",
            "test \"$1\" = --",
            "sh",
            "--",
        ])
        .success();
    world
        .run(&["lock", "demo", "--", "env", "--", "true"])
        .success();
    world.run(&["lock", "demo", "touch", marker]).success();
    assert!(std::path::Path::new(marker).exists());
}

/// The cells of the row of NAME in `redsem status`'s table, split at spaces.
fn row(table: &str, name: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} listed: {table}"));
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn status_shows_no_permits_for_a_name_without_a_permit_pool() {
    let world = World::new();
    world.acquire("exports", 2, &[]);
    world.run(&["permits", "gpu", "try-set", "1"]).success();
    world.run(&["permits", "gpu", "acquire", "-n"]).success();
    world.run(&["latch", "ready", "set", "3"]).success();
    let out = world.run(&["status"]).success();
    let header = row(&out.stdout, "NAME");
    assert_eq!(
        header,
        ["NAME", "IN", "USE", "LIMIT", "WAITING", "PERMITS", "LATCH"],
        "{}",
        out.stdout
    );
    // NAME, IN USE, LIMIT, WAITING, PERMITS, LATCH (which may be "3 to go").
    assert_eq!(
        row(&out.stdout, "exports")[..5],
        ["exports", "1", "2", "0", "-"]
    );
    assert_eq!(row(&out.stdout, "exports")[5..], ["-"]);
    // A pool whose permits are all taken has 0, not "-".
    assert_eq!(row(&out.stdout, "gpu")[..5], ["gpu", "-", "-", "-", "0"]);
    assert_eq!(
        row(&out.stdout, "ready")[..5],
        ["ready", "-", "-", "-", "-"]
    );
    // The JSON keeps its documented object: "available" is 0 both with no pool and with all
    // taken, the same in `status NAME --json` and in the list.
    let list: serde_json::Value =
        serde_json::from_str(&world.run(&["status", "--json"]).success().stdout).expect("JSON");
    for (i, name) in ["exports", "gpu", "ready"].into_iter().enumerate() {
        assert_eq!(list[i]["name"], name, "{list}");
        assert_eq!(
            list[i]["permits"],
            serde_json::json!({"available": 0}),
            "{list}"
        );
        assert_eq!(world.status(name)["permits"], list[i]["permits"], "{name}");
    }
}

#[test]
fn a_port_out_of_range_is_named_as_such() {
    for (args, code) in [
        (&["status"][..], 2),
        (&["run", "x", "-l", "1", "--", "true"], 125),
    ] {
        for url in [
            "redis://127.0.0.1:99999",
            "redis://app:secret@127.0.0.1:65536/0",
        ] {
            let mut all = vec!["--url", url];
            all.extend(args);
            let out = finish(bare(&all)).expect(code);
            let port = url.rsplit(':').next().unwrap_or_default();
            let port = port.split('/').next().unwrap_or_default();
            assert!(
                out.error().contains(&format!(
                    "the port \"{port}\" is not a number from 1 to 65535"
                )),
                "{out:?}"
            );
            assert!(!out.error().contains("not a URL"), "{out:?}");
            assert!(!out.error().contains("secret"), "{out:?}");
        }
    }
}

#[test]
fn redsem_alone_prints_the_short_help_on_stderr_and_exits_2() {
    let short = finish(bare(&["-h"])).success().stdout;
    let mut with_url = bare(&[]);
    with_url.env("REDIS_URL", "redis://127.0.0.1:6379");
    for out in [finish(bare(&[])), finish(with_url)] {
        assert_eq!(out.code(), 2, "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        assert_eq!(out.stderr, short, "the help of -h");
        for part in ["Usage: redsem", "Commands:", "run", "lock", "--help"] {
            assert!(out.stderr.contains(part), "{part}: {out:?}");
        }
        for long in ["Examples:", "Exit codes", "--replica-acks"] {
            assert!(!out.stderr.contains(long), "{long}: {out:?}");
        }
    }
}
