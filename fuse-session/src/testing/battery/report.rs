//! The battery's report: how each scenario ended ([`Outcome`]), its
//! result with the violations seen in it ([`ScenarioResult`]), and every
//! scenario's result ([`BatteryReport`]) with the readable `Display`
//! that `assert_passed` prints.

use crate::testing::checker::Violation;
use std::fmt;

/// How one scenario ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every step gave the expected result, with no protocol violation.
    Passed,
    /// The filesystem does not implement an operation the scenario needs,
    /// or refused it as it declared.
    Unsupported(String),
    /// Steps gave other results (each difference), or broke rules of the
    /// protocol.
    Failed(Vec<String>),
}

/// The outcome of one scenario, with the violations the checker saw in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioResult {
    /// The scenario's name (`rename_over_existing`, …).
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// The protocol violations during the scenario (each fails it).
    pub violations: Vec<Violation>,
}

/// Every scenario's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use = "the report says which scenarios failed: call assert_passed()"]
pub struct BatteryReport {
    /// In the order they ran.
    pub results: Vec<ScenarioResult>,
}

impl BatteryReport {
    /// The scenarios that failed.
    pub fn failed(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
    }

    /// The scenarios the filesystem does not support.
    pub fn unsupported(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Unsupported(_)))
    }

    /// The scenarios that passed.
    pub fn passed(&self) -> impl Iterator<Item = &ScenarioResult> {
        self.results.iter().filter(|r| r.outcome == Outcome::Passed)
    }

    /// The outcome of scenario `name`.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.results.iter().find(|r| r.name == name).map(|r| &r.outcome)
    }

    /// Panics, printing the report, if a scenario failed (unsupported ones
    /// do not fail).
    #[track_caller]
    pub fn assert_passed(&self) {
        if self.failed().next().is_some() {
            panic!("the conformance battery failed:\n{self}");
        }
    }
}

impl fmt::Display for BatteryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            match &r.outcome {
                Outcome::Passed => writeln!(f, "  passed       {}", r.name)?,
                Outcome::Unsupported(why) => writeln!(f, "  unsupported  {}: {why}", r.name)?,
                Outcome::Failed(why) => {
                    writeln!(f, "  FAILED       {}", r.name)?;
                    for d in why {
                        writeln!(f, "               {d}")?;
                    }
                }
            }
            for v in &r.violations {
                writeln!(f, "               {v}")?;
            }
        }
        Ok(())
    }
}
