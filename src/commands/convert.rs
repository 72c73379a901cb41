//! `crd-lifecycle convert`.

use crd_lifecycle::convert_objects::{self, ConvertSettings, ObjectFormat};

use super::CommandError;
use crate::cli;

pub fn run(args: &cli::ConvertArgs) -> Result<(), CommandError> {
    let settings = ConvertSettings {
        policy: args.policy.clone(),
        to: args.to.clone(),
        objects: args.objects.clone(),
        crd: args.crd.clone(),
        output: match args.output {
            cli::ObjectFormat::Yaml => ObjectFormat::Yaml,
            cli::ObjectFormat::Json => ObjectFormat::Json,
        },
    };
    convert_objects::run(&settings, &mut std::io::stdout().lock()).map_err(CommandError::invalid)
}
