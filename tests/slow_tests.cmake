# Included by ctest (TEST_INCLUDE_FILES, tests/CMakeLists.txt) after the test
# cases are discovered: the slowest tests get a COST, their time in seconds
# as measured in the full suite, so that ctest starts them first. In a fresh
# build directory ctest has no timings of its own yet (it keeps them in
# Testing/Temporary/CTestCostData.txt after a run, and those then count
# instead), and would otherwise start a long test last, to run alone at the
# end. Only tests of this directory (tests/) can be named here: the ones of
# examples/ and python/ are defined after it. A renamed or removed test only
# loses its place here (ctest ignores names it does not know).
set_tests_properties(ConfigKeysTest.EveryKeyChangesBehaviour PROPERTIES COST 42)
set_tests_properties(StableEquilibriaTest.TheImplicitCellContractsWithTheDefaultPenalty
  PROPERTIES COST 28)
set_tests_properties(ExpFamAttentionTrainingTest.ExplicitTransformerLearnsTheReverseTask
  PROPERTIES COST 13)
set_tests_properties(SeedDemosTest.CorrectionImprovesUnclampedAndShiftedAccuracy PROPERTIES COST 11)
set_tests_properties(StableEquilibriaTest.TheEnergyModelContractsAndTrainsWithTheExactGradient
  PROPERTIES COST 8)
set_tests_properties(EnergyTransformerExampleTest.LearnsTheReverseTaskOnAReducedBudget
  PROPERTIES COST 6)
