// The policy model learning arithmetic in one process: a supervised
// warm-up on a fixed labelled set, then GRPO with the verifier's reward,
// beside more supervised training as the baseline (rl/train/local_grpo.h).
// Prints each evaluation as it happens and, with --curve FILE, writes the
// curves as JSON lines (docs/model.md's table comes from them).
//
//   troupe_example_rl_arithmetic --curve curve.jsonl
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>

#include "train/local_grpo.h"

using namespace troupe::rl;

int main(int argc, char** argv) {
  train::LocalGrpoConfig c = train::arithmetic_weak_teacher_run();  // docs/model.md's run
  std::string curve_path;
  CLI::App app{"troupe: the policy model learning arithmetic (supervised warm-up, then GRPO vs more supervision)"};
  app.add_option("--layers", c.model.layers);
  app.add_option("--heads", c.model.heads);
  app.add_option("--channels", c.model.channels);
  app.add_option("--seed", c.seed);
  app.add_option("--warmup-examples", c.warmup_examples, "labelled problems in the warm-up set");
  app.add_option("--warmup-steps", c.warmup_steps);
  app.add_option("--warmup-batch", c.warmup_batch);
  app.add_option("--carry-drop", c.warmup_carry_drop, "the warm-up teacher drops each carry with this probability");
  app.add_option("--warmup-lr", c.warmup_optim.learning_rate);
  app.add_option("--warmup-min-digits", c.warmup_task.min_digits);
  app.add_option("--warmup-max-digits", c.warmup_task.max_digits);
  app.add_option("--rl-min-digits", c.rl_task.min_digits);
  app.add_option("--rl-max-digits", c.rl_task.max_digits);
  app.add_option("--eval-min-digits", c.eval_task.min_digits);
  app.add_option("--eval-max-digits", c.eval_task.max_digits);
  app.add_option("--rl-steps", c.rl_steps);
  app.add_option("--prompts", c.prompts_per_step, "prompts per GRPO step");
  app.add_option("--group", c.group_size, "samples per prompt");
  app.add_option("--rl-lr", c.rl_optim.learning_rate);
  app.add_option("--temperature", c.sampling.temperature);
  app.add_option("--eval-problems", c.eval_problems);
  app.add_option("--eval-every", c.eval_every);
  app.add_option("--baseline-steps", c.baseline_steps, "supervised steps of the baseline (0: none)");
  app.add_option("--curve", curve_path, "write the curves here as JSON lines");
  CLI11_PARSE(app, argc, argv);

  std::ofstream curve;
  if (!curve_path.empty()) curve.open(curve_path);
  auto result = train::run_local_grpo(c, [&](const train::CurvePoint& p) {
    std::printf("%-10s step %4zu  %7.1f s  held-out accuracy %5.1f%%  %s %.3f\n", p.phase.c_str(), p.step,
                p.seconds, 100 * p.accuracy, p.phase == "grpo" ? "reward" : "loss", p.train_signal);
    std::fflush(stdout);
    if (curve.is_open()) {
      curve << "{\"phase\":\"" << p.phase << "\",\"step\":" << p.step << ",\"seconds\":" << p.seconds
            << ",\"accuracy\":" << p.accuracy << ",\"train_signal\":" << p.train_signal << "}\n";
    }
  });
  if (!result) {
    std::fprintf(stderr, "error: %s\n", result.error().to_string().c_str());
    return 1;
  }
  std::printf("held-out accuracy: warm-up %.1f%% -> GRPO %.1f%%; more supervised training %.1f%%\n",
              100 * result->warmup_accuracy, 100 * result->grpo_accuracy, 100 * result->supervised_accuracy);
  return 0;
}
