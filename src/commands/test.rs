//! `crd-lifecycle test`.

use crd_lifecycle::conversion_test::{self, TestSettings};

use super::CommandError;
use crate::cli::TestArgs;

pub fn run(args: &TestArgs) -> Result<(), CommandError> {
    let settings = TestSettings {
        policy: args.policy.clone(),
        crd: args.crd.clone(),
        cases: args.cases,
        seed: args.seed,
        objects: args.objects.clone(),
        record: args.record.clone(),
        golden: args.golden.clone(),
    };
    let outcome =
        conversion_test::run(&settings, &mut std::io::stdout().lock()).map_err(CommandError::invalid)?;
    match outcome.failure {
        None => Ok(()),
        Some(failure) => Err(CommandError::Failed(format!(
            "{}: {} (at {})",
            failure.conversion,
            failure.message,
            if failure.path.is_empty() {
                "the whole object"
            } else {
                &failure.path
            }
        ))),
    }
}
