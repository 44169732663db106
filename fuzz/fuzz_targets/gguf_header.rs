//! posenc's GGUF header scan (`posenc_models::gguf::scan_header`) on any
//! bytes: it must never panic or allocate beyond its caps, and every header
//! it accepts must be read by candle's reader without error, to the same
//! tensor count and data offset (the scan is what stands between a file
//! and candle).
#![no_main]

use std::io::Cursor;

use candle_core::quantized::gguf_file::Content;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(scan) = posenc_models::gguf::scan_header(&mut Cursor::new(data), data.len() as u64)
    else {
        return;
    };
    let content = Content::read(&mut Cursor::new(data))
        .expect("candle's reader refuses a header the scan accepted");
    assert_eq!(content.tensor_infos.len(), scan.tensors);
    assert_eq!(content.tensor_data_offset, scan.data_offset);
});
