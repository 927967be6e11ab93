//! Reading the kernel's one-value sysfs files (the library never writes
//! them: changing system settings is for explicit guards, see foliokit-lab).

use std::path::Path;

pub fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

pub fn read_usize(path: impl AsRef<Path>) -> Option<usize> {
    read(path)?.parse().ok()
}

/// The selected word of a sysfs choice list: "always [madvise] never" → "madvise".
pub fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn selected_word() {
        assert_eq!(super::selected("always [madvise] never"), Some("madvise"));
        assert_eq!(super::selected("[never]"), Some("never"));
        assert_eq!(super::selected("none"), None);
    }
}
