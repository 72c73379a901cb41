//! `crd-lifecycle docgen` (hidden): writes the book's generated pages.

use super::CommandError;
use crate::cli::DocgenArgs;

pub fn run(args: &DocgenArgs) -> Result<(), CommandError> {
    let written = crate::docgen::write_pages(&args.out, &args.man, &args.bench_results)
        .map_err(CommandError::failed)?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
