// mnist_mt: training (no subcommand), `eval` and `predict` of a checkpoint, --version.
// Exit codes: 0 done, 2 bad input or usage, 3 a failure while running, 130/143 a
// training stopped by SIGINT/SIGTERM (128 + the signal). Every error is one line on
// stderr. Under mpirun/srun, training runs as one of several processes.
#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "commands.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/processes.hpp"
#include "mnist_mt/trainer.hpp"
#include "outputs.hpp"
#include "signal_watch.hpp"

namespace {

// One line whatever the message quotes (one_line).
void report(const char* what) { std::cerr << "mnist_mt: error: " << mnist_mt::cli::one_line(what) << std::endl; }

// Runs the chosen command, mapping errors to exit codes. `speaks(error)` says whether
// this process prints the error's line (it may wait first).
int guarded(const std::function<int()>& command,
            const std::function<bool(const std::exception&)>& speaks = [](const std::exception&) { return true; }) {
  const auto report = [&](const std::exception& e) {
    if (speaks(e)) ::report(e.what());
  };
  try {
    return command();
  } catch (const mnist_mt::Interrupted& e) {  // a second SIGINT or SIGTERM: aborted at once
    report(e);
    return 128 + e.signal();
  } catch (const mnist_mt::InputError& e) {
    report(e);
    return 2;
  } catch (const std::exception& e) {
    report(e);
    return 3;
  } catch (...) {
    report(std::runtime_error("unknown failure"));
    return 3;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mnist_mt::cli;
  CLI::App app("mnist_mt: data-parallel training of the MNIST CNN, a thread per device", "mnist_mt");
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version, the backends built and the libraries' versions");
  TrainFlags train;
  add_train_flags(app, train);
  EvalFlags eval;
  CLI::App* eval_app = app.add_subcommand("eval", "Test loss, accuracy, per-class accuracy and confusion of --load");
  add_eval_flags(*eval_app, eval);
  PredictFlags predict;
  CLI::App* predict_app = app.add_subcommand("predict", "The digit and its probability for each image or --index");
  add_predict_flags(*predict_app, predict);
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    report(e.what());
    return 2;
  }
  if (show_version) {
    print_version();
    return 0;
  }
  // Training's flags before a subcommand would be read as training's and silently not
  // applied to it ("mnist_mt --precision bf16 eval ...").
  for (const CLI::App* sub : {eval_app, predict_app}) {
    if (!sub->parsed()) continue;
    for (const CLI::Option* option : app.get_options())
      if (option->count() > 0) {
        const std::string flag = option->get_name(), command = sub->get_name();
        report((flag + ": given before '" + command + "', " +
                (sub->get_option_no_throw(flag) != nullptr
                     ? "which takes its flags after it (mnist_mt " + command + " " + flag + " ...)"
                     : "which has no such flag (training has)"))
                   .c_str());
        return 2;
      }
  }
  // As training does (SignalWatch): a reader that closes the pipe early fails the
  // writes to stdout, which finish_stdout reports, instead of ending us before our files.
  std::signal(SIGPIPE, SIG_IGN);
  // Likewise a file size limit (ulimit -f): a write past it then fails with EFBIG, which
  // the file's writer reports (exit 3, its temp file removed), instead of SIGXFSZ ending
  // us with a temp file left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  if (eval_app->parsed()) return guarded([&] { return run_eval(eval); });
  if (predict_app->parsed()) return guarded([&] { return run_predict(predict); });
  // Training only: the first SIGINT/SIGTERM stops it after the step in flight with a
  // checkpoint. Made before training starts any thread, so that every thread blocks them.
  mnist_mt::StopRequest stop;
  const mnist_mt::SignalWatch signals(stop);
  // Under mpirun/srun: MPI is initialised after the signals are blocked, so that its
  // threads leave them to the watch. A process that fails ends every process of the
  // launch (MPI_Abort), having said why: its peers would wait for it otherwise. A bad
  // input that every process finds alike is reported by process 0 alone, whose abort
  // ends the others (they wait for it, and abort themselves only if it never comes);
  // other failures that several processes may meet at once are printed by the others
  // after a second, time for process 0's abort to end them first. Fewer simultaneous
  // aborts also keep Open MPI 4.1's mpirun from crashing.
  std::shared_ptr<mnist_mt::Processes> processes;
  if (mnist_mt::launcher_processes() > 1) stop.exit_at_first_signal();  // from MPI_Init on
  bool silent = false;
  const int code = guarded(
      [&] {
        processes = mnist_mt::join_launch(argc, argv, train.timeout);
        return run_train(train, stop, processes);
      },
      [&](const std::exception& e) {
        if (!processes || processes->index() == 0) return true;
        silent = dynamic_cast<const mnist_mt::SameOnEveryProcess*>(&e) != nullptr;
        if (!silent) std::this_thread::sleep_for(std::chrono::seconds(1));
        return !silent;
      });
  if (silent) std::this_thread::sleep_for(std::chrono::seconds(30));
  if (code != 0 && processes) processes->abort(code);
  return code;
}
