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
/// One plotted series: the matrix's layer, the end of its size (`" file"`, `" files"`, `"iB"`: the bytes of the single file's size, not the small files' bytes of a raw TCP row; `""` for any), the
/// legend and the colour.
struct Series(&'static str, &'static str, &'static str, Rgb);

/// The throughput plot's bars, per path.
const THROUGHPUT: [Series; 12] = [
    Series("raw TCP", "iB", "raw TCP", [120, 120, 120]),
    Series("ferry send", " file", "send, 1 file", [52, 101, 164]),
    Series("ferry send", " files", "send, files", [114, 159, 207]),
    Series("ferry pull", " file", "pull, 1 file", [78, 154, 6]),
    Series("ferry pull", " files", "pull, files", [138, 226, 52]),
    Series("ferry mount", " file", "mount, 1 file", [6, 152, 154]),
    Series("scp", " file", "scp", [164, 0, 0]),
    Series("scp", " files", "scp, files", [239, 41, 41]),
    Series("rsync", " file", "rsync", [92, 53, 102]),
    Series("rsync", " files", "rsync, files", [173, 127, 168]),
    Series("croc", " file", "croc", [143, 89, 2]),
    Series("croc", " files", "croc, files", [233, 185, 110]),
];

/// The waterfall's steps, each against the one before it: the layers under one file's `ferry send`.
const WATERFALL: [Series; 4] = [
    Series("raw TCP", "iB", "raw TCP", [120, 120, 120]),
    Series("AEAD", "", "AEAD in memory", [196, 160, 0]),
    Series("channel", "", "channel", [117, 80, 123]),
    Series("ferry send", " file", "ferry send, 1 file", [52, 101, 164]),
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

/// A path's name, its description and each series' rate as a share of the wire.
type Shares = (&'static str, String, Vec<Option<f64>>);

/// Per emulated path: its name, its description and each series' rate as a share of the wire. The AEAD,
/// measured once in memory, is set against each path's wire.
fn shares(cells: &[Cell], series: &[Series]) -> Vec<Shares> {
    let aead = cells.iter().find(|c| c.layer == "AEAD").map(Cell::rate);
    let mut out: Vec<Shares> = Vec::new();
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
            let mut values = vec![None; series.len()];
            if let (Some(i), Some(rate), Some(wire)) =
                (series.iter().position(|s| s.0 == "AEAD"), aead, c.wire)
            {
                values[i] = Some(rate / wire);
            }
            out.push((c.path, describe, values));
        }
        let slot = series
            .iter()
            .position(|s| c.layer == s.0 && c.size.ends_with(s.1));
        if let (Some(i), Some(last)) = (slot, out.last_mut()) {
            last.2[i] = c.ratio();
        }
    }
    out
}

/// A share as a bar's label: two decimals, or a whole multiple of the wire when far above it.
fn label(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}x")
    } else {
        format!("{v:.2}")
    }
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

/// The legend from (x, y), wrapped to a second line where the canvas ends.
fn legend(c: &mut Canvas, x0: usize, y: usize, items: &[(Rgb, &str)]) {
    let (mut x, mut y) = (x0, y);
    for (colour, name) in items {
        if x + 16 + name.len() * 8 > c.w {
            (x, y) = (x0, y + 14);
        }
        c.rect(x, y, x + 12, y + 8, *colour);
        c.text(x + 16, y, name, 1, INK);
        x += 16 + name.len() * 8 + 24;
    }
}

/// The rows behind the plots, saved beside them so that they can be drawn again.
const ROWS: &str = "matrix.jsonl";

/// Draws the plots again from rows saved by earlier runs (`matrix.jsonl` files, or `--json` output):
/// a row of a later file replaces the same path, layer and size of an earlier one, so a rerun of some rows
/// can be drawn with the rest of a full run. The files written (the PNGs and the merged rows).
pub fn redraw(files: &[PathBuf], dir: &FsPath) -> io::Result<Vec<PathBuf>> {
    let mut cells: Vec<Cell> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        for (n, line) in text.lines().enumerate() {
            let bad = |what: &str| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: {what}", file.display(), n + 1),
                )
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue; // a table line or a message, not a row
            };
            if v["bench"] != "matrix" || v.get("note").is_some() {
                continue;
            }
            let text = |key: &str| {
                v[key]
                    .as_str()
                    .map(|s| &*Box::leak(s.to_string().into_boxed_str()))
                    .ok_or_else(|| bad(&format!("no {key}")))
            };
            let number = |key: &str| v[key].as_f64();
            let cell = Cell {
                path: text("path")?,
                layer: text("layer")?,
                size: text("size")?.to_string(),
                bytes: v["bytes"].as_u64().ok_or_else(|| bad("no bytes"))?,
                seconds: number("seconds")
                    .filter(|s| *s > 0.0)
                    .ok_or_else(|| bad("no seconds"))?,
                wire: number("wire_mb_s").map(|w| w * 1e6),
                connected: number("connected_ms").map(|v| v / 1e3),
                first_byte: number("first_byte_ms").map(|v| v / 1e3),
                verified: v["verified"].as_bool(),
            };
            let same =
                |c: &Cell| c.path == cell.path && c.layer == cell.layer && c.size == cell.size;
            match cells.iter_mut().find(|c| same(c)) {
                Some(old) => *old = cell,
                None => cells.push(cell),
            }
        }
    }
    if cells.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no matrix rows in the files given",
        ));
    }
    // Rows from several runs: keep each path's rows together, in the order the paths were first seen.
    let mut order: Vec<&'static str> = Vec::new();
    for c in &cells {
        if !order.contains(&c.path) {
            order.push(c.path);
        }
    }
    cells.sort_by_key(|c| order.iter().position(|p| *p == c.path));
    write(&cells, dir)
}

/// Writes `throughput.png`, `waterfall.png` and the rows behind them (`matrix.jsonl`) into `dir`; the
/// files written.
pub(super) fn write(cells: &[Cell], dir: &FsPath) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let rows = dir.join(ROWS);
    let mut jsonl = String::new();
    for c in cells {
        jsonl.push_str(&c.to_json());
        jsonl.push('\n');
    }
    std::fs::write(&rows, jsonl)?;

    // Throughput per path against the wire.
    let paths = shares(cells, &THROUGHPUT);
    let (bar, step) = (26, 30);
    let group = THROUGHPUT.len() * step + 30;
    let mut c = Canvas::new(120 + paths.len().max(1) * group, 500);
    let f = Frame::draw(
        &mut c,
        "ferry bench matrix: throughput per path",
        "payload rate as a share of the emulated wire (loopback has no wire: see the table); files: the small files",
    );
    let items: Vec<(Rgb, &str)> = THROUGHPUT.iter().map(|s| (s.3, s.2)).collect();
    legend(&mut c, 20, 60, &items);
    for (g, (name, describe, values)) in paths.iter().enumerate() {
        let x0 = f.left + 20 + g * group;
        for (i, v) in values.iter().enumerate() {
            let Some(v) = v else { continue };
            let x = x0 + i * step;
            c.rect(x, f.y(*v), x + bar, f.bottom, THROUGHPUT[i].3);
            // Alternate label heights so that neighbours' labels do not overlap.
            let above = 12 + (i % 2) * 10;
            c.text_centred(
                x + bar / 2,
                f.y(*v).saturating_sub(above),
                &label(*v),
                1,
                INK,
            );
        }
        let mid = x0 + THROUGHPUT.len() * step / 2;
        c.text_centred(mid, f.bottom + 12, name, 2, INK);
        c.text_centred(mid, f.bottom + 34, describe, 1, INK);
    }
    let throughput = dir.join("throughput.png");
    c.save(&throughput)?;

    // The layer waterfall: from the wire, what each layer keeps (solid) and loses (pale) against the
    // layer before it. The AEAD in memory, a CPU ceiling far above the wire, is drawn at the height of the
    // layer before it, labelled with its own share; `ferry send` above the one-stream channel (its lanes)
    // is drawn at its own height.
    let paths = shares(cells, &WATERFALL);
    let group = (WATERFALL.len() + 1) * 40 + 40;
    let mut c = Canvas::new(180 + paths.len().max(1) * group, 480);
    let f = Frame::draw(
        &mut c,
        "ferry bench matrix: where the wire goes",
        "each bar against the one before it; pale: what that step lost (send above the channel: its lanes)",
    );
    let mut items = vec![(WIRE, "wire")];
    items.extend(WATERFALL.iter().map(|s| (s.3, s.2)));
    items.push((LOST, "lost"));
    legend(&mut c, 20, 60, &items);
    for (g, (name, describe, values)) in paths.iter().enumerate() {
        let x0 = f.left + 20 + g * group;
        c.rect(x0, f.y(1.0), x0 + 36, f.bottom, WIRE);
        let mut before: f64 = 1.0;
        for (i, v) in values.iter().enumerate() {
            let Some(v) = *v else { continue };
            let x = x0 + (i + 1) * 40;
            let shown = if WATERFALL[i].0 == "AEAD" {
                v.min(before)
            } else {
                v
            };
            if shown < before {
                c.rect(x, f.y(before), x + 36, f.y(shown), LOST);
            }
            c.rect(x, f.y(shown), x + 36, f.bottom, WATERFALL[i].3);
            c.text_centred(
                x + 18,
                f.y(before.max(shown)).saturating_sub(12),
                &label(v),
                1,
                INK,
            );
            before = shown;
        }
        let mid = x0 + (WATERFALL.len() + 1) * 20;
        c.text_centred(mid, f.bottom + 12, name, 2, INK);
        c.text_centred(mid, f.bottom + 34, describe, 1, INK);
    }
    let waterfall = dir.join("waterfall.png");
    c.save(&waterfall)?;
    Ok(vec![throughput, waterfall, rows])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, layer: &str, size: &str, seconds: f64) -> String {
        let c = Cell {
            path: Box::leak(path.to_string().into_boxed_str()),
            layer: Box::leak(layer.to_string().into_boxed_str()),
            size: size.to_string(),
            bytes: 1 << 30,
            seconds,
            wire: Some(62.5e6),
            connected: Some(0.08),
            first_byte: Some(0.09),
            verified: Some(true),
        };
        c.to_json()
    }

    #[test]
    fn redraw_merges_saved_rows_and_a_later_run_replaces_its_rows() {
        let dir = std::env::temp_dir().join(format!("ferry-replot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = dir.join("full.jsonl");
        let second = dir.join("rerun.jsonl");
        std::fs::write(
            &first,
            [
                row("wan", "raw TCP", "1 GiB", 18.3),
                row("wan", "ferry send", "1 GiB file", 18.4),
                "{\"bench\":\"matrix\",\"path\":\"wan\",\"note\":\"a note\"}".to_string(),
                row("lan", "ferry send", "1 GiB file", 9.0),
            ]
            .join("\n"),
        )
        .unwrap();
        std::fs::write(
            &second,
            "a table line\n".to_string() + &row("wan", "ferry send", "1 GiB file", 18.0),
        )
        .unwrap();
        let out = dir.join("plots");
        let written = redraw(&[first, second], &out).unwrap();
        assert_eq!(written.len(), 3);
        let merged = std::fs::read_to_string(out.join(ROWS)).unwrap();
        let lines: Vec<&str> = merged.lines().collect();
        assert_eq!(lines.len(), 3, "{merged}");
        assert!(lines[1].contains("\"layer\":\"ferry send\"") && lines[1].contains("18.000000"));
        assert!(lines[2].contains("\"path\":\"lan\""));
        for png in &written[..2] {
            assert!(std::fs::metadata(png).unwrap().len() > 1000);
        }
        let empty = dir.join("empty.jsonl");
        std::fs::write(&empty, "nothing\n").unwrap();
        assert!(redraw(&[empty], &out).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
