//! The store conformance suite (`ember_snapshot::conformance`) on a
//! `LocalStore`; the S3 and JetStream backends run the same functions.
mod common;

#[test]
fn local_store_passes_the_store_conformance_suite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = common::local_store(&tmp.path().join("store"));
    ember_snapshot::conformance::run_all(&store, tmp.path());
}

/// A get checks the object's size before reading it: a store file someone
/// planted over the cap (sparse: no data written) is refused, not read.
#[test]
fn local_get_refuses_an_object_over_the_cap_before_reading_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = common::local_store(&tmp.path().join("store"));
    std::fs::create_dir_all(tmp.path().join("store/chunks")).expect("mkdir");
    let f = std::fs::File::create(tmp.path().join("store/chunks/huge")).expect("create");
    f.set_len(ember_snapshot::MAX_OBJECT_BYTES + 1).expect("set_len");
    let err = match ember_snapshot::ObjectStore::get(&store, "chunks/huge") {
        Ok(data) => panic!("read {} bytes, over the cap", data.len()),
        Err(e) => e,
    };
    assert!(matches!(err, ember_snapshot::StoreError::TooLarge { .. }), "{err:?}");
}
