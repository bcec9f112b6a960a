//! The matrix's PNG plots, drawn here: filled rectangles and an embedded 8x8 bitmap font (font8x8, public
//! domain), so that no system font and no plotting stack is needed on a fresh machine.

use std::io;
use std::path::{Path as FsPath, PathBuf};

use font8x8::UnicodeFonts;

use super::Cell;

type Rgb = [u8; 3];
const WHITE: Rgb = [255, 255, 255];
const INK: Rgb = [40, 40, 40];
const GRID: Rgb = [225, 225, 225];
const WIRE: Rgb = [170, 170, 170];
const LOST: Rgb = [240, 170, 160];
/// One colour per layer, in [`LAYERS`] order.
const COLOURS: [Rgb; 3] = [[120, 120, 120], [52, 101, 164], [230, 140, 30]];

/// The layers plotted, by (layer, size suffix) as the matrix names them, and their legend.
const LAYERS: [(&str, &str, &str); 3] = [
    ("raw TCP", "", "raw TCP"),
    ("ferry send", " file", "ferry send, one file"),
    ("ferry send", " files", "ferry send, small files"),
];

/// An RGB image.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Canvas {
        Canvas {
            w,
            h,
            px: WHITE.repeat(w * h),
        }
    }

    fn rect(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: Rgb) {
        for y in y0.min(self.h)..y1.min(self.h) {
            for x in x0.min(self.w)..x1.min(self.w) {
                let i = (y * self.w + x) * 3;
                self.px[i..i + 3].copy_from_slice(&c);
            }
        }
    }

    /// `s` with its top-left corner at (x, y), each font pixel `scale` pixels square.
    fn text(&mut self, x: usize, y: usize, s: &str, scale: usize, c: Rgb) {
        for (i, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS.get(ch).unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        let (px, py) = (x + (i * 8 + col) * scale, y + row * scale);
                        self.rect(px, py, px + scale, py + scale, c);
                    }
                }
            }
        }
    }

    /// `s` centred on `cx`.
    fn text_centred(&mut self, cx: usize, y: usize, s: &str, scale: usize, c: Rgb) {
        let w = s.chars().count() * 8 * scale;
        self.text(cx.saturating_sub(w / 2), y, s, scale, c);
    }

    fn save(&self, path: &FsPath) -> io::Result<()> {
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut enc = png::Encoder::new(file, self.w as u32, self.h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(io::Error::other)?;
        w.write_image_data(&self.px).map_err(io::Error::other)?;
        w.finish().map_err(io::Error::other)
    }
}

/// Per emulated path: its name, its description and each layer's rate as a share of the wire.
fn shares(cells: &[Cell]) -> Vec<(&'static str, String, [Option<f64>; 3])> {
    let mut out: Vec<(&'static str, String, [Option<f64>; 3])> = Vec::new();
    for c in cells.iter().filter(|c| c.wire.is_some()) {
        if out.last().is_none_or(|(p, _, _)| *p != c.path) {
            let describe = ferry_lab::Path::by_name(c.path).map_or_else(String::new, |p| {
                let l = p.link.expect("emulated");
                format!(
                    "{}M {}ms",
                    l.rate_bps / 1_000_000,
                    l.rtt.as_secs_f64() * 1e3
                )
            });
            out.push((c.path, describe, [None; 3]));
        }
        let slot = LAYERS
            .iter()
            .position(|(layer, suffix, _)| c.layer == *layer && c.size.ends_with(suffix));
        if let (Some(i), Some(last)) = (slot, out.last_mut()) {
            last.2[i] = c.ratio();
        }
    }
    out
}

/// The plot area's frame: margins, the y axis from 0 to 1.1 of the wire with its grid and labels.
struct Frame {
    left: usize,
    top: usize,
    bottom: usize,
}

impl Frame {
    const MAX: f64 = 1.1;

    fn draw(c: &mut Canvas, title: &str, subtitle: &str) -> Frame {
        let f = Frame {
            left: 70,
            top: 90,
            bottom: c.h - 70,
        };
        c.text(20, 14, title, 2, INK);
        c.text(20, 40, subtitle, 1, INK);
        for tenth in 0..=11 {
            let v = tenth as f64 / 10.0;
            let y = f.y(v);
            c.rect(
                f.left,
                y,
                c.w - 20,
                y + 1,
                if tenth == 10 { WIRE } else { GRID },
            );
            if tenth % 2 == 0 || tenth == 11 {
                c.text(20, y.saturating_sub(4), &format!("{v:.1}"), 1, INK);
            }
        }
        c.text(c.w - 92, f.y(1.0) - 12, "the wire", 1, WIRE);
        f
    }

    fn y(&self, share: f64) -> usize {
        let h = (self.bottom - self.top) as f64;
        self.bottom - (share.clamp(0.0, Self::MAX) / Self::MAX * h) as usize
    }
}

fn legend(c: &mut Canvas, x: usize, y: usize, items: &[(Rgb, &str)]) {
    let mut x = x;
    for (colour, name) in items {
        c.rect(x, y, x + 12, y + 8, *colour);
        c.text(x + 16, y, name, 1, INK);
        x += 16 + name.len() * 8 + 24;
    }
}

/// Writes `throughput.png` and `waterfall.png` into `dir`; the files written.
pub(super) fn write(cells: &[Cell], dir: &FsPath) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let paths = shares(cells);
    let groups = paths.len().max(1);
    let width = 120 + groups * 190;

    // Throughput per path against the wire.
    let mut c = Canvas::new(width, 480);
    let f = Frame::draw(
        &mut c,
        "ferry bench matrix: throughput per path",
        "payload rate as a share of the emulated wire (loopback has no wire: see the table)",
    );
    let items: Vec<(Rgb, &str)> = COLOURS.iter().zip(LAYERS).map(|(c, l)| (*c, l.2)).collect();
    legend(&mut c, 20, 60, &items);
    for (g, (name, describe, values)) in paths.iter().enumerate() {
        let x0 = f.left + 20 + g * 190;
        for (i, v) in values.iter().enumerate() {
            let Some(v) = v else { continue };
            let x = x0 + i * 52;
            c.rect(x, f.y(*v), x + 44, f.bottom, COLOURS[i]);
            c.text_centred(
                x + 22,
                f.y(*v).saturating_sub(12),
                &format!("{v:.2}"),
                1,
                INK,
            );
        }
        c.text_centred(x0 + 78, f.bottom + 12, name, 2, INK);
        c.text_centred(x0 + 78, f.bottom + 34, describe, 1, INK);
    }
    let throughput = dir.join("throughput.png");
    c.save(&throughput)?;

    // The layer waterfall: from the wire, what each layer keeps (solid) and loses (pale) against the
    // layer before it.
    let mut c = Canvas::new(width + 60, 480);
    let f = Frame::draw(
        &mut c,
        "ferry bench matrix: where the wire goes",
        "each bar against the one before it; pale: what that step lost",
    );
    let mut items = vec![(WIRE, "wire")];
    items.extend(COLOURS.iter().zip(LAYERS).map(|(c, l)| (*c, l.2)));
    items.push((LOST, "lost"));
    legend(&mut c, 20, 60, &items);
    for (g, (name, describe, values)) in paths.iter().enumerate() {
        let x0 = f.left + 20 + g * 190;
        c.rect(x0, f.y(1.0), x0 + 36, f.bottom, WIRE);
        let mut before = 1.0;
        for (i, v) in values.iter().enumerate() {
            let Some(v) = *v else { continue };
            let x = x0 + (i + 1) * 40;
            if v < before {
                c.rect(x, f.y(before), x + 36, f.y(v), LOST);
            }
            c.rect(x, f.y(v), x + 36, f.bottom, COLOURS[i]);
            c.text_centred(
                x + 18,
                f.y(v.max(before)).saturating_sub(12),
                &format!("{v:.2}"),
                1,
                INK,
            );
            before = v;
        }
        c.text_centred(x0 + 78, f.bottom + 12, name, 2, INK);
        c.text_centred(x0 + 78, f.bottom + 34, describe, 1, INK);
    }
    let waterfall = dir.join("waterfall.png");
    c.save(&waterfall)?;
    Ok(vec![throughput, waterfall])
}
