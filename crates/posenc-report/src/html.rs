//! `index.html`: the report's Markdown turned into one self-contained page
//! (figures embedded as PNG data URIs), with a script that records how many
//! figures decoded in `data-figures-loaded="N/M"` on `<body>`.

use super::figures::base64;

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45;color:#222}\
table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}td,th{border:1px solid #ccc;padding:.25rem .5rem;vertical-align:top}\
th{background:#f3f3f3}img.figure{max-width:100%;display:block;margin:1rem auto}pre{background:#f6f6f6;padding:.5rem;overflow-x:auto}\
code{background:#f3f3f3;padding:0 .2rem}figcaption{text-align:center;font-size:.9rem;color:#555}";

const SCRIPT: &str = "<script>\nwindow.addEventListener('load',function(){var f=document.querySelectorAll('img.figure'),n=0;\
for(var i=0;i<f.length;i++){if(f[i].complete&&f[i].naturalWidth>0){n++;}}\
document.body.setAttribute('data-figures-loaded',n+'/'+f.length);});\n</script>\n";

/// Escapes text, keeping the few tags the Markdown uses.
fn esc(s: &str) -> String {
    let keep = ["<br>", "<sub>", "</sub>", "<a id=", "</a>"];
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.char_indices() {
        match c {
            '<' if keep.iter().any(|k| s[i..].starts_with(k)) => out.push('<'),
            '<' => out.push_str("&lt;"),
            '&' => out.push_str("&amp;"),
            _ => out.push(c),
        }
    }
    out
}

/// Inline Markdown: `**bold**`, `*em*`, `` `code` ``.
fn inline(s: &str) -> String {
    let mut out = String::new();
    let (mut b, mut e, mut c) = (false, false, false);
    let chars: Vec<char> = esc(s).chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        if ch == '`' {
            out.push_str(if c { "</code>" } else { "<code>" });
            c = !c;
        } else if !c && ch == '*' && chars.get(i + 1) == Some(&'*') {
            out.push_str(if b { "</strong>" } else { "<strong>" });
            b = !b;
            i += 1;
        } else if !c && ch == '*' && (e || chars.get(i + 1).is_some_and(|n| !n.is_whitespace())) {
            out.push_str(if e { "</em>" } else { "<em>" });
            e = !e;
        } else {
            out.push(ch);
        }
        i += 1;
    }
    for (open, tag) in [(c, "</code>"), (e, "</em>"), (b, "</strong>")] {
        if open {
            out.push_str(tag);
        }
    }
    out
}

fn cells(line: &str) -> Vec<String> {
    let t = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut v = Vec::new();
    let mut cur = String::new();
    let mut prev = ' ';
    for ch in t.chars() {
        if ch == '|' && prev != '\\' {
            v.push(cur.trim().to_string());
            cur.clear();
        } else if ch == '|' {
            cur.pop();
            cur.push('|');
        } else {
            cur.push(ch);
        }
        prev = ch;
    }
    v.push(cur.trim().to_string());
    v
}

/// The page: `md` converted, each `![caption](path)` line replaced by the
/// PNG `figure(path)` returns, embedded.
pub fn page(title: &str, md: &str, figure: &dyn Fn(&str) -> Option<Vec<u8>>) -> String {
    let mut h = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        esc(title)
    );
    let lines: Vec<&str> = md.lines().collect();
    let mut i = 0;
    let mut para = String::new();
    let flush = |para: &mut String, h: &mut String| {
        if !para.trim().is_empty() {
            h.push_str(&format!("<p>{}</p>\n", inline(para.trim())));
        }
        para.clear();
    };
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with("```") {
            flush(&mut para, &mut h);
            h.push_str("<pre>");
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                h.push_str(&esc(lines[i]));
                h.push('\n');
                i += 1;
            }
            h.push_str("</pre>\n");
        } else if l.starts_with('#') {
            flush(&mut para, &mut h);
            let n = l.chars().take_while(|&c| c == '#').count().min(6);
            h.push_str(&format!("<h{n}>{}</h{n}>\n", inline(l[n..].trim())));
        } else if l.starts_with("![") {
            flush(&mut para, &mut h);
            if let (Some(a), Some(b)) = (l.find("]("), l.rfind(')')) {
                let cap = &l[2..a];
                let path = &l[a + 2..b];
                if let Some(png) = figure(path) {
                    h.push_str(&format!(
                        "<figure><img class=\"figure\" alt=\"{}\" src=\"data:image/png;base64,{}\"><figcaption>{}</figcaption></figure>\n",
                        esc(cap).replace('"', "&quot;"),
                        base64(&png),
                        inline(cap)
                    ));
                }
            }
        } else if l.starts_with('|') {
            flush(&mut para, &mut h);
            h.push_str("<table>\n");
            let head = cells(l);
            h.push_str("<tr>");
            for c in head {
                h.push_str(&format!("<th>{}</th>", inline(&c)));
            }
            h.push_str("</tr>\n");
            i += 1;
            if i < lines.len() && lines[i].starts_with("|-") {
                i += 1;
            }
            while i < lines.len() && lines[i].starts_with('|') {
                h.push_str("<tr>");
                for c in cells(lines[i]) {
                    h.push_str(&format!("<td>{}</td>", inline(&c)));
                }
                h.push_str("</tr>\n");
                i += 1;
            }
            h.push_str("</table>\n");
            continue;
        } else if l.starts_with("<a id=") {
            flush(&mut para, &mut h);
            h.push_str(l);
            h.push('\n');
        } else if l.trim().is_empty() {
            flush(&mut para, &mut h);
        } else {
            para.push_str(l);
            para.push(' ');
        }
        i += 1;
    }
    flush(&mut para, &mut h);
    h.push_str(SCRIPT);
    h.push_str("</body>\n</html>\n");
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn figures_are_embedded_and_text_escaped() {
        let md =
            "# T\n\na < b **bold**\n\n![cap](figures/x.png)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n";
        let h = super::page("t", md, &|p| (p == "figures/x.png").then(|| vec![1, 2, 3]));
        assert!(h.contains("a &lt; b <strong>bold</strong>"));
        assert!(h.contains("src=\"data:image/png;base64,AQID\""));
        assert!(h.contains("<td>1</td><td>2</td>"));
        assert!(h.contains("data-figures-loaded"));
    }
}
