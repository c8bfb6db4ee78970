//! The SDK's side of the packed layout (`weir_layout`): appending bytes and
//! headers to one buffer, and reading spans of it back without panicking.
//! A batch (`Rows::pack`) and a transform's answer (`Outcomes`) are both
//! packed this way.

use weir_layout::{Span, header};

/// Appends bytes and headers to one buffer, handing out their spans.
#[derive(Default)]
pub(crate) struct Packer {
    pub data: Vec<u8>,
    /// [`header::BYTES`] bytes (little-endian numbers) per header.
    pub header_numbers: Vec<u8>,
}

impl Packer {
    pub fn append(&mut self, bytes: &[u8]) -> Span {
        let start = self.data.len();
        self.data.extend_from_slice(bytes);
        Span::from_range(start..self.data.len())
    }

    /// Appends the bytes `write` writes.
    pub fn append_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> Span {
        let start = self.data.len();
        write(&mut self.data);
        Span::from_range(start..self.data.len())
    }

    /// Appends headers; returns their run (first header, count).
    pub fn headers<'h>(&mut self, headers: impl IntoIterator<Item = (&'h str, &'h str)>) -> Span {
        let first = self.header_count();
        for (name, value) in headers {
            let record = header::Record {
                name: self.append(name.as_bytes()),
                value: self.append(value.as_bytes()),
            };
            self.header_numbers.extend_from_slice(&record.encode());
        }
        Span::from_range(first..self.header_count())
    }

    fn header_count(&self) -> usize {
        header::count(&self.header_numbers)
    }
}

// The host packs batches itself, so spans are in bounds and strings UTF-8;
// the fallbacks keep a broken host from making a plugin panic.
pub(crate) fn bytes(data: &[u8], span: Span) -> &[u8] {
    span.get(data).unwrap_or_default()
}

pub(crate) fn text(data: &[u8], span: Span) -> &str {
    std::str::from_utf8(bytes(data, span)).unwrap_or_default()
}
