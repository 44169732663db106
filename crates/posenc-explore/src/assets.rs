//! The page, embedded in the binary.

/// `index.html`.
pub const INDEX_HTML: &str = include_str!("../assets/index.html");
/// `app.js`: the views, the URL state and the canvas charts.
pub const APP_JS: &str = include_str!("../assets/app.js");
/// `style.css`.
pub const STYLE_CSS: &str = include_str!("../assets/style.css");
