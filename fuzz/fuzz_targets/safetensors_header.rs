//! The safetensors header reader posenc's checkpoint loader relies on
//! (`safetensors::SafeTensors`, through candle's `MmapedSafetensors`) on
//! any bytes: it must never panic, and every tensor of a header it accepts
//! must have exactly the bytes its shape and type need.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(st) = safetensors::SafeTensors::deserialize(data) else {
        return;
    };
    for (name, view) in st.tensors() {
        let elems: usize = view.shape().iter().product();
        let bits = elems.checked_mul(view.dtype().bitsize());
        assert_eq!(
            bits.map(|b| b.div_ceil(8)),
            Some(view.data().len()),
            "{name}: data of another size than its shape"
        );
    }
});
