//! What the machine's host does to fresh memory, which no run controls.

use std::path::Path;

/// Bit of a virtio balloon's feature string saying it reports free pages
/// (`VIRTIO_BALLOON_F_REPORTING`).
const BALLOON_F_REPORTING: usize = 5;
/// The virtio device id of a memory balloon.
const VIRTIO_ID_BALLOON: &str = "0x0005";

/// Where this guest reports free memory to its host (a virtio balloon with
/// free page reporting): the smallest block reported, in bytes. The host
/// then drops what backed it, so a later fault of that memory waits for the
/// host to back it again; whether a pass finds its memory reported depends
/// on how long ago the previous one freed it, so fresh-memory rows swing
/// from pass to pass. `None` where nothing says so.
fn free_page_reporting() -> Option<usize> {
    let devices = std::fs::read_dir("/sys/bus/virtio/devices").ok()?;
    let reporting = devices.flatten().any(|d| {
        let p = d.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        read("device").trim() == VIRTIO_ID_BALLOON
            && read("features").as_bytes().get(BALLOON_F_REPORTING) == Some(&b'1')
            && std::fs::read_link(p.join("driver")).is_ok()
    });
    if !reporting {
        return None;
    }
    let order: u32 = std::fs::read_to_string(Path::new(
        "/sys/module/page_reporting/parameters/page_reporting_order",
    ))
    .ok()?
    .trim()
    .parse()
    .ok()?;
    Some(foliokit::batch::page_size() << order)
}

/// The line a report of fresh-memory faults carries where
/// [`free_page_reporting`] finds the host taking freed memory back.
pub fn fresh_memory_note() -> Option<String> {
    free_page_reporting().map(|block| {
        format!(
            "this guest reports free memory to its host in blocks of {} (virtio balloon free page reporting): a fault of fresh memory may wait for the host to back it again, by chance per pass",
            crate::units::show_size(block)
        )
    })
}
