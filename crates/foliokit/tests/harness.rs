//! The test harness's own rules: what `FOLIOKIT_REQUIRE` may say.

mod common;

use common::need::{parse_required, Need};

#[test]
fn require_lists_parse_by_name_and_refuse_typos() {
    assert_eq!(parse_required("").unwrap(), vec![]);
    assert_eq!(
        parse_required("uffd, relocation,,root").unwrap(),
        vec![Need::Uffd, Need::Relocation, Need::Root]
    );
    assert_eq!(parse_required("all").unwrap(), Need::ALL.to_vec());
    for n in Need::ALL {
        assert_eq!(parse_required(n.name()).unwrap(), vec![n], "{n}");
    }
    let e = parse_required("uffd,relocaton").unwrap_err();
    assert!(e.contains("'relocaton'") && e.contains("relocation"), "{e}");
}
