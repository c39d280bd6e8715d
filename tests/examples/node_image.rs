//! Builds the product's image with buildah and imports it into a running node's containerd
//! ([`vcp_tests::node::operator_image`]), for `scripts/demo`:
//!
//! ```text
//! cargo run -p vcp-tests --example node_image -- --dir <the node's folder>
//! ```
//!
//! Prints `IMAGE=<reference>` (the reference of `config/manager/manager.yaml`). Exits 1 with the
//! error when there is no node in the folder or the build fails.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = match (args.next().as_deref(), args.next()) {
        (Some("--dir"), Some(dir)) => PathBuf::from(dir),
        _ => anyhow::bail!("usage: node_image --dir <folder of scripts/node up>"),
    };
    let node = vcp_tests::node::Node::attach(&dir)?;
    let reference = vcp_tests::node::operator_image(&node)?;
    println!("IMAGE={reference}");
    Ok(())
}
