// The progress display: a bar on the terminal's standard error that fits
// its width (read again after SIGWINCH) and is cleared and redrawn around
// messages; plain lines elsewhere; only messages for "none".
#include "training/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

namespace stillpoint::progress_test {
namespace {

// What a terminal would show on each redraw: the text between carriage
// returns and newlines, with the clear-to-end-of-line sequence removed.
std::vector<std::string> Redraws(std::string text) {
  for (std::size_t at = text.find("\033[K"); at != std::string::npos; at = text.find("\033[K")) {
    text.erase(at, 3);
  }
  std::vector<std::string> pieces;
  std::string piece;
  for (char c : text) {
    if (c == '\r' || c == '\n') {
      if (!piece.empty()) pieces.push_back(piece);
      piece.clear();
    } else {
      piece += c;
    }
  }
  if (!piece.empty()) pieces.push_back(piece);
  return pieces;
}

TEST(ProgressTest, TheBarFitsTheTerminalAndFollowsAResize) {
  std::ostringstream messages, bar;
  int columns = 120;
  ProgressTerminal terminal{&bar, [&columns] { return columns; }};
  Progress progress(&messages, "bar", 100, 0, terminal);
  progress.Update(10, 1.5, 0.25, 7.5, true);
  std::vector<std::string> drawn = Redraws(bar.str());
  ASSERT_EQ(drawn.size(), 1u);
  EXPECT_LE(drawn[0].size(), 119u) << drawn[0];
  // The bar takes the width the text leaves (up to 40), filled to 10%.
  ASSERT_EQ(drawn[0][0], '[');
  const std::size_t bar_width = drawn[0].find(']') - 1;
  EXPECT_GE(bar_width, 10u);
  EXPECT_EQ(static_cast<std::size_t>(std::count(drawn[0].begin(), drawn[0].end(), '#')),
            bar_width * 10 / 100);
  EXPECT_NE(drawn[0].find("step 10/100  loss 1.5000  acc 25.0%  fwd iters 7.5  "),
            std::string::npos)
      << drawn[0];
  EXPECT_NE(drawn[0].find(" ms/step  0:00 elapsed  ETA 0:00"), std::string::npos) << drawn[0];

  // The terminal shrinks to 50 columns: every later redraw fits in 49.
  columns = 50;
  std::raise(SIGWINCH);
  bar.str("");
  for (int step = 11; step <= 100; step += 10) progress.Update(step, 1.0, 0.5, 3.0, true);
  progress.Message("eval at step 100: test accuracy 50.00%");
  progress.Finish();
  drawn = Redraws(bar.str());
  ASSERT_GE(drawn.size(), 10u);
  for (const std::string& line : drawn) {
    EXPECT_LE(line.size(), 49u) << line;
    // Shorter text keeps a bar on the line.
    EXPECT_EQ(line.rfind("[", 0), 0u) << line;
    EXPECT_NE(line.find("acc 50.0%"), std::string::npos) << line;
  }
  // The message cleared the bar line before it and the bar came back after.
  const std::string raw = bar.str();
  const std::size_t clear = raw.rfind("\r\033[K");
  ASSERT_NE(clear, std::string::npos);
  EXPECT_EQ(raw.find('\r', clear + 1) != std::string::npos, true) << "no redraw after the message";
  EXPECT_EQ(raw.back(), '\n');  // Finish ends the bar line
  EXPECT_EQ(messages.str(), "eval at step 100: test accuracy 50.00%\n");
}

TEST(ProgressTest, LinesWhenNotATerminalAndOnlyMessagesForNone) {
  auto run = [](const std::string& mode) {
    std::ostringstream out, bar;
    Progress progress(&out, mode, 4, 0, ProgressTerminal{&bar, [] { return 80; }});
    for (int step = 1; step <= 4; ++step) progress.Update(step, 1.0 / step, 0.25 * step, 7.5, true);
    progress.Message("eval at step 4");
    progress.Finish();
    EXPECT_EQ(bar.str(), "") << mode;  // no bar off a terminal
    return out.str();
  };
  const std::string lines = run("lines");
  EXPECT_EQ(lines.find('\r'), std::string::npos) << lines;
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 5) << lines;
  EXPECT_EQ(lines.rfind("step 1/4  loss 1.0000  acc 25.0%  fwd iters 7.5  ", 0), 0u) << lines;
  EXPECT_NE(lines.find(" ms/step  0:00 elapsed  ETA 0:00\n"), std::string::npos) << lines;
  EXPECT_EQ(run("none"), "eval at step 4\n");
  // "auto" on a stream that is not standard output: lines.
  const std::string automatic = run("auto");
  EXPECT_EQ(std::count(automatic.begin(), automatic.end(), '\n'), 5) << automatic;
  EXPECT_EQ(automatic.find('\r'), std::string::npos);
}

TEST(ProgressTest, NarrowerTerminalsGetShorterTextThenNoBarThenACut) {
  const auto draw = [](int columns) {
    std::ostringstream messages, bar;
    Progress progress(&messages, "bar", 10, 0,
                      ProgressTerminal{&bar, [columns] { return columns; }});
    progress.Update(5, 0.5, 0.5, 4.0, true);
    const std::vector<std::string> drawn = Redraws(bar.str());
    EXPECT_EQ(drawn.size(), 1u);
    return drawn.empty() ? std::string() : drawn[0];
  };
  // 70 columns: the compact text with the rate and the ETA, and a bar.
  std::string line = draw(70);
  EXPECT_LE(line.size(), 69u);
  EXPECT_NE(line.find("] 5/10 loss 0.500 acc 50.0% it 4.0 "), std::string::npos) << line;
  EXPECT_NE(line.find(" ms/step ETA 0:"), std::string::npos) << line;
  // 30 columns: steps and accuracy beside a bar of at least 8.
  line = draw(30);
  EXPECT_LE(line.size(), 29u);
  EXPECT_EQ(line.rfind("[", 0), 0u) << line;
  EXPECT_GE(line.find(']'), 9u) << line;
  EXPECT_NE(line.find("] 5/10 acc 50.0%"), std::string::npos) << line;
  // 20 columns: no room for a bar, the short text alone.
  EXPECT_EQ(draw(20), "5/10 acc 50.0%");
  // 10 columns: the short text, cut.
  EXPECT_EQ(draw(10), "5/10 acc ");
}

}  // namespace
}  // namespace stillpoint::progress_test
