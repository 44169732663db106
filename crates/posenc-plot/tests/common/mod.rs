//! Helpers shared by the picture tests (included with `mod common;`).
#![allow(dead_code)]

use posenc_plot::{Rgb, RgbImage};

/// Decodes PNG bytes; returns (width, height, RGB bytes).
pub fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(bytes);
    let mut reader = decoder.read_info().expect("valid PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("valid PNG data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Number of distinct colours.
pub fn distinct_colours(img: &RgbImage) -> usize {
    let mut set = std::collections::HashSet::new();
    for p in img.pixels.chunks(3) {
        set.insert((p[0], p[1], p[2]));
    }
    set.len()
}

/// Pixels in the rectangle `[x0, x1) × [y0, y1)` that are dark (text ink).
pub fn dark_pixels(img: &RgbImage, x0: u32, x1: u32, y0: u32, y1: u32) -> usize {
    let mut n = 0;
    for y in y0..y1.min(img.height) {
        for x in x0..x1.min(img.width) {
            let Rgb(r, g, b) = img.pixel(x, y).unwrap();
            if (r as u32 + g as u32 + b as u32) < 3 * 110 {
                n += 1;
            }
        }
    }
    n
}

/// Count and mean position of the pixels of exactly colour `c`.
pub fn centroid(img: &RgbImage, c: Rgb) -> (usize, f64, f64) {
    let (mut n, mut sx, mut sy) = (0usize, 0.0, 0.0);
    for y in 0..img.height {
        for x in 0..img.width {
            if img.pixel(x, y) == Some(c) {
                n += 1;
                sx += x as f64;
                sy += y as f64;
            }
        }
    }
    (n, sx / n.max(1) as f64, sy / n.max(1) as f64)
}

/// Parses an SVG document; checks the root and its size; returns all text.
pub fn svg_texts(svg: &str, width: u32, height: u32) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some(width.to_string().as_str()));
    assert_eq!(root.attribute("height"), Some(height.to_string().as_str()));
    root.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

/// Number of elements named `tag`.
pub fn svg_count(svg: &str, tag: &str) -> usize {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants().filter(|n| n.has_tag_name(tag)).count()
}
