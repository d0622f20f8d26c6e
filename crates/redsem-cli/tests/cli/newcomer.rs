//! What a new user trips on (issue 21): typos get clap's suggestion, errors name what is
//! accepted, `status` lists every kind of primitive, one JSON schema, a latch never set is
//! told from an open one, short and long help.

use crate::support::{World, bare, finish};

#[test]
fn a_mistyped_option_or_subcommand_gets_the_suggestion_on_its_one_line() {
    let out = finish(bare(&["run", "demo", "--limt", "2", "--", "true"])).expect(125);
    assert!(
        out.error().contains("a similar argument exists: '--limit'"),
        "{out:?}"
    );
    assert!(!out.error().contains("to pass"), "{out:?}");
    let out = finish(bare(&["stauts"])).expect(2);
    assert!(
        out.error().contains("a similar subcommand exists: 'status'"),
        "{out:?}"
    );
    let world = World::new();
    let out = world.run(&["status", "--jsn"]).expect(2);
    assert!(out.error().contains("'--json'"), "{out:?}");
}
