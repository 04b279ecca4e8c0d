"""The bank: the lecture's ten self-check questions, as data (lab/teach/selfcheck/questions.py asks
them).

The right answers follow the lecture's corrected edition; each question has an explanation in this
project's words and a note for each tempting wrong option (grading.py's `right` and `wrong`).

  q1  choices         right first token, wrong later: the causes                (lecture section 4)
  q2  choice          must the position advance inside the graph?                (section 2)
  q3  choice          a loop bound vs a grid size: what to do with each          (section 2)
  q4  number+choices  standard error 0.55 -> 0.02 ms: variance, consequences     (section 1)
  q5  choice          why the error names the wrong kernel                       (section 3)
  q6  choice          two runs of one build differ at 128k: the likely cause     (section 5)
  q7  choices         what else gains value once the step is captured            (section 6)
  q8  choices         which reductions reorder bit-identically                   (section 8)
  q9  choice          more KV precision, worse parity with the reference         (section 9)
  q10 choice          the comparator fails one file against itself               (section 9)
"""
from __future__ import annotations

import math

from .grading import Question, right, wrong

# q4: the lecture's standard errors of the mean per-token time, eager and captured (ms).
SEM_EAGER_MS = 0.55
SEM_GRAPH_MS = 0.02
SEM_RATIO = SEM_EAGER_MS / SEM_GRAPH_MS


QUESTIONS: dict[str, Question] = {q.id: q for q in (
    Question(
        "q1", "4",
        "A captured decode step gives a right first token, then fluent but wrong tokens after it "
        "(in this lab's demo the replays differ from the eager steps from replay 2 on). Which of "
        "these can cause exactly that? Pick every one that can.",
        "choices",
        (right("the KV-cache row address, computed from the position on the host and frozen "
               "into the graph at capture"),
         wrong("capturing ran the recorded kernels once, so the first replay did the step a "
               "second time",
               "a capture records the launches without running any kernel"),
         right("the position advanced by host code that runs at capture but never before a "
               "replay"),
         right("the input token id handed to the embedding kernel as a by-value argument"),
         wrong("float32 rounding: a replay adds its partial sums in another order than the "
               "eager launches do",
               "a replay runs the same kernels with the same arguments in the same order as the "
               "eager step: with deterministic kernels and the same state the bytes match"),
         right("a dependency between two pieces of work in the step that the graph does not "
               "hold")),
        hint="which per-token values can a capture freeze, and does a capture run anything?",
        explanation=(
            "The class is state that stops changing: a per-token value frozen into the graph "
            "when it was captured (or a dependency the graph lost). The first replay re-runs the "
            "captured step, for which the frozen value is still right; later replays reuse it "
            "and go wrong, from replay 2 in this lab (later, when a plan change re-captures in "
            "between). Look first at whatever must differ per token: pointers that depend on the "
            "position (KV-cache rows), the position update, the input-token update, any "
            "recurrent state. Capturing only records launches; it executes none of them.")),
    Question(
        "q2", "2",
        "This engine advances the decode position with a kernel inside the captured step. Is "
        "that the only correct design, and where can the position live?",
        "choice",
        (wrong("Yes: a replay cannot see anything the host does between two launches, so the "
               "advance must be a captured kernel, on a position that lives in device memory.",
               "a replay reads device memory when it runs, and an executable graph's node "
               "parameters can be updated between launches: either lets the host advance it"),
         right("No: each launch must see the current position, whether a captured kernel advances "
               "a device buffer or the host writes it or updates a node parameter."),
         wrong("No: the position can stay a by-value argument of a plain captured graph; the "
               "host increments its own variable before each launch and the replay reads it.",
               "a by-value argument is copied into the graph at capture: a host variable changed "
               "later reaches a replay only through an update of the node's parameters"),
         wrong("Yes: while a graph of the step exists the host may not write the device memory "
               "it reads, so no update from the host between launches is allowed.",
               "the host may write device memory between graph launches, in stream order; the "
               "next replay reads what was written")),
        hint="when does a replay read device memory, and what can change between two launches "
             "of one executable graph? (notebook 11 updates a live graph)",
        explanation=(
            "It need not be inside. What must hold is that each launch sees the current "
            "position, not one baked in at capture. This engine keeps it in a device buffer and "
            "advances it with a kernel that belongs to the graph, so N replays decode N tokens "
            "with no host work between them. Another design is as safe: the host writes the "
            "device position between launches, or updates the kernel node's by-value parameter "
            "in the executable graph (notebook 11 updates a live graph's nodes). What breaks is "
            "host code that ran only at capture.")),
    Question(
        "q3", "2",
        "Inside attention the context length is only a loop bound; the number of splits sets the "
        "attention grid. What do you do with each before capturing?",
        "choice",
        (wrong("splits: the kernel reads it from device memory like any other input; context "
               "length: capture one graph per context length, since it changes every loop.",
               "a plain kernel node keeps the grid it was captured with, and a graph per context "
               "length means a capture for every token"),
         wrong("neither: a kernel cannot read its own loop bound from device memory at run time, "
               "so both become capture keys, and every new value means a new graph.",
               "a kernel can load its loop bound from memory while it runs; what a replay keeps "
               "is the recorded launch, grid included"),
         right("context length: the kernel reads it from device memory while it runs; splits: a "
               "host decision, one graph per plan, re-captured or updated as it moves."),
         wrong("both go to device memory: a plain captured kernel node reads its grid from a "
               "device buffer at every replay, so nothing ever needs capturing again.",
               "a captured kernel node keeps its recorded grid; changing it takes an explicit "
               "update (from the host, or from the device for a device-updatable node) or a "
               "conditional node that picks among prebuilt bodies")),
        hint="which of the two does the kernel read while it runs, and which belongs to the "
             "recorded launch?",
        explanation=(
            "A loop bound is read by the kernel while it runs, so it can come from device memory "
            "at replay time: this engine's attention computes the context length from the "
            "device position. A grid belongs to the recorded launch: a replay uses it as "
            "captured unless something changes the node on purpose: the host (an executable "
            "graph update, or setting a kernel node's parameters), the device (a "
            "device-updatable kernel node), or a conditional SWITCH node that runs one of "
            "several prebuilt bodies chosen by a device value (notebook 11 shows the host update "
            "and the SWITCH). This engine keeps splits a host decision made by decode_plan, part "
            "of the capture key, and re-captures when the key moves (a cache of graphs per key "
            "would also do). The launcher and the stale-graph check call the same decode_plan, "
            "so they cannot disagree.")),
    Question(
        "q4", "1",
        f"Graph capture cut the standard error of the mean per-token time from {SEM_EAGER_MS} ms "
        f"(eager) to {SEM_GRAPH_MS} ms (captured), with the same number of reps in each arm. By "
        "what factor did the estimated variance of the per-rep times fall? And which of these "
        "are consequences for how you run your benchmarks from now on? Pick every one.",
        "number+choices",
        (right("Keep both arms in paired, interleaved reps within one session: the eager arm "
               "still drifts between sessions, so an old eager number is no baseline."),
         right("Measure the tail (p99) on its own, over many requests: a handful of per-rep "
               "means and their standard errors says nothing about it."),
         right("With the captured arms this tight, smaller real differences between them "
               "become resolvable with the same number of reps."),
         wrong("Now that the noise is gone, one rep per arm is enough: drop the repetitions, "
               "and with them the standard error, from every report.",
               "the standard error is still what says whether a difference is real; a small "
               "one is measured, not assumed"),
         wrong("The tail is compressed as much as the standard error, so p99 can be read off "
               "the five reps' standard error, with no separate measurement at all.",
               "five paired means and their standard errors say nothing about p99: measure the "
               "tail over enough requests"),
         wrong("Compare each new captured build with the eager figures recorded last month: "
               "with the host out of the loop, drift between sessions is gone for good.",
               "the eager arm moved ~15% between sessions in the lecture's report: compare arms "
               "measured together, interleaved")),
        number=SEM_RATIO ** 2,
        rel_tol=0.02,
        number_notes={SEM_RATIO: "that is the ratio of the standard errors; a variance goes "
                                 "with the square of a spread",
                      math.sqrt(SEM_RATIO): "that is the square root of the standard errors' "
                                            "ratio; a variance goes with the square of a spread"},
        hint="with equal reps a standard error scales with the standard deviation; then ask what "
             "paired reps protect against, and what a few means cannot show",
        explanation=(
            "With equal sample counts the standard error scales with the standard deviation, so "
            f"it fell {SEM_RATIO:.3g}x and the estimated variance by its square, about "
            f"{SEM_RATIO ** 2:.0f}x. Consequences: keep measuring in paired, interleaved reps "
            "(the eager arm still drifts between sessions, so never compare against an old "
            "eager run); the tighter captured arms resolve smaller wins with the same reps; and "
            "a few means say nothing about the tail: measure p99 on its own, over many "
            "requests.")),
    Question(
        "q5", "3",
        "A table upload made lazily on first use breaks the capture at the first MoE layer, yet "
        "the error message names the MoE dispatch kernel. Why?",
        "choice",
        (wrong("The dispatch kernel reads the table before the asynchronous upload has "
               "finished, and that race makes the dispatch itself fail.",
               "a race gives wrong numbers, not a capture error; and during a capture nothing "
               "runs yet, the step is only being recorded"),
         wrong("Capture recorded the upload as a copy node; instantiation accepted it, and the "
               "node failed later, when a replay reached the dispatch.",
               "the synchronous copy is refused during the capture itself and invalidates it: "
               "no graph is made"),
         wrong("The illegal upload left a sticky error that corrupts the CUDA context, so every "
               "later call fails and the first one checked takes the blame.",
               "sticky errors are those that corrupt the context (a kernel's illegal address, "
               "say) and need a new process; an illegal call in a capture fails at once with "
               "cudaErrorStreamCaptureUnsupported and invalidates the capture, and the context "
               "stays usable"),
         right("The synchronous upload is illegal in a capture: it fails at once and invalidates "
               "it; unchecked, that shows at the next check, after the dispatch."),
         wrong("The dispatch kernel is the real fault; that the lazy upload ran just before "
               "it is a coincidence of timing, nothing more.",
               "an error shows at the call that is checked next, so the name it carries says "
               "where it was noticed, not where it began")),
        hint="where was the error noticed, and where did it begin?",
        explanation=(
            "An error is reported where it is noticed, which can be later than where it began. "
            "A synchronous copy while the stream captures is refused at once "
            "(cudaErrorStreamCaptureUnsupported) and invalidates the capture; code that ignores "
            "that call's status learns of it at the next check: after the dispatch launch, which "
            "fails into the invalidated capture, or at end_capture. An asynchronous fault inside "
            "a kernel does the same, surfacing at a later synchronising call. So the kernel "
            "named in a message is not evidence: check the capture status, every initialisation "
            "call that can run inside a capture, each launch's error and its completion. Then do "
            "first-use work (tables, scratch, handles) at start-up, before any capture.")),
    Question(
        "q6", "5",
        "You byte-compare two runs of the same build at context 128k and they differ. The "
        "benchmark reaches 128k by seeking: it sets the position without writing the KV rows "
        "before it. What is the likely cause?",
        "choice",
        (wrong("Graph capture is broken at long context: one of the two runs replayed a graph "
               "that was captured for a much shorter context.",
               "the same build against itself differs too: the comparison, not the capture, is "
               "what cannot be trusted"),
         wrong("A seek invalidates the captured graph, so one run replays a stale graph while "
               "the other one re-captures at the new position.",
               "a seek writes the device position; the graph is chosen by the plan key, which "
               "a seek does not break"),
         right("Attention reads KV rows nobody wrote, and unset memory differs between runs: "
               "run the setup against itself (A/A), check initialisation."),
         wrong("float32 rounding is not reproducible at long context: past some length byte "
               "compares stop working, so compare with a tolerance instead.",
               "kernels with a fixed reduction order give the same bytes on the same inputs, at "
               "any context; a tolerance would hide the real cause")),
        hint="what do the cache rows before 128k hold after a seek, and what would an A/A say?",
        explanation=(
            "Before concluding anything, make sure the comparison can tell a difference at all: "
            "the same inputs (hash them), state reset between runs, every buffer initialised, "
            "deterministic kernels, no races, and the configuration run against itself. A seek "
            "skips the prefix, so attention reads cache rows that were never written. "
            "Uninitialised, they hold leftovers that differ from run to run: the A/A fails too, "
            "and the test is what is broken. Zero-initialised, both runs read the same zeros and "
            "an A/A can pass, but neither stands for a real 128k prefix.")),
    Question(
        "q7", "6",
        "A one-kernel design was right while every kernel was launched from the host; after the "
        "decode step was captured, splitting it into two kernels won. Which of these other "
        "optimisation classes gain value the same way once the step is captured? Pick every "
        "one that does.",
        "choices",
        (wrong("fusing two kernels into one only to save the launch between them",
               "part of what fusion bought was the launch that capture already removed: it is "
               "worth less, not more"),
         right("specialised kernel variants instead of one kernel full of branches"),
         wrong("cutting the bytes a kernel reads from memory, by packing its weights more "
               "tightly",
               "a kernel's memory traffic costs the same in a graph node as in an eager launch"),
         right("an extra small kernel that gives one phase a better grid, such as a separate "
               "merge"),
         wrong("replacing numba's per-call dispatcher with launches bound once, to shave the "
               "host cost of each eager launch",
               "it cuts the host cost of eager launches, which a captured step no longer pays")),
        hint="what did an extra kernel cost when launched from the host, and what does it cost "
             "as a node of a captured graph?",
        explanation=(
            "Eagerly, every launch costs a host submit, so a second kernel had to pay for itself "
            "and the single kernel won. A captured step is submitted once; an extra node costs "
            "only its device-side overhead, so a split that gives each half a grid that fills "
            "the GPU can now win. The same shift favours specialised variants over one branchy "
            "kernel and small extra phases with better grids. Nodes are still not free: count "
            "their overhead and the traffic between the halves.")),
    Question(
        "q8", "8",
        "Which of these reductions can you reorder and still claim a bit-identical result? "
        "(Finite inputs; for the maximum, a fixed rule for ties, NaN and signed zero.) Pick "
        "every one.",
        "choices",
        (wrong("a sum of float32 values",
               "float addition rounds at each step and is not associative"),
         right("the largest magnitude |x|"),
         wrong("a product of float32 values",
               "float multiplication rounds at each step and is not associative"),
         right("a bitwise OR of integers")),
        hint="which of these operations round their result, and which are exact in any order?",
        explanation=(
            "Floating-point addition and multiplication round after every operation, so another "
            "grouping can change the last bits: reorder them only with a tolerance, and say so. "
            "Bitwise OR (and AND, XOR) of fixed-width integers is associative and commutative: "
            "every order gives the same bits. The maximum of finite non-negative magnitudes is "
            "the same value in any order, once NaN, signed zero and ties (which index wins, for "
            "an argmax) have a fixed rule; without that rule, do not claim identical bytes.")),
    Question(
        "q9", "9",
        "Your engine keeps its KV cache in float32; the implementation you are scored against "
        "keeps it in float16. Your parity metric against it gets worse the more precision you "
        "keep. What do you conclude, and do?",
        "choice",
        (right("Parity with one rounding implementation and error against the exact result are "
               "two measurements: rule out other differences, report both."),
         wrong("Switch the cache to float16: matching the reference's storage type is sure to "
               "bring the logits closer, whatever else differs between them.",
               "the lecture's own table shows the float16 candidate farther from the reference: "
               "rounding, kernel changes and mismatched weights all move it"),
         wrong("More precision can only bring you closer to any reference, so a parity metric "
               "that worsens as precision grows is broken: stop reporting it.",
               "a reference that rounds is not the exact result; being closer to the "
               "mathematics can move you away from it"),
         wrong("KL divergence is a metric, so subtracting each arm's divergence from the "
               "reference gives the distance between the two arms.",
               "KL divergence is not a metric: offsets against a third run do not cancel")),
        hint="is the implementation you are scored against the exact result?",
        explanation=(
            "Precision and agreement with one particular implementation are two different goals. "
            "An implementation that rounds its cache to float16 is not the exact result, so a "
            "float32 cache can sit closer to the mathematics and farther from it. But storage "
            "precision alone does not predict the combined effect: in the lecture's own table "
            "the float16 change moved the build farther from the reference. Make both sides use "
            "identical weights and inputs, isolate the one change, and report both numbers: the "
            "distance to the reference implementation and the error against a float64 oracle "
            "(lab/reference.py here).")),
    Question(
        "q10", "9",
        "A logit-comparison tool prints FAIL for your build against the reference's saved "
        "logits, for main against them, and for that saved file compared with itself (the same "
        "file given as both inputs; nothing is re-run). What do you conclude?",
        "choice",
        (wrong("Its threshold is meant for two runs of one implementation, so FAILs across "
               "implementations are expected: ignore all three verdicts.",
               "a tolerance explains FAILs between implementations, not a FAIL of one file "
               "against itself"),
         right("The tool is suspect: a file against itself must give zero divergence. Check its "
               "threshold, parsing, normalisation, determinism."),
         wrong("All three are wrong, the reference included: even its own logits fail, so its "
               "saved file must be corrupt as well.",
               "the same bytes on both sides fail: the tool, not the builds, is shown broken"),
         wrong("The reference is not deterministic: its logits differ from run to run, and the "
               "tool, with its strict bar, works as intended.",
               "one saved file was given twice and nothing was re-run: determinism cannot "
               "enter")),
        hint="what must any comparison say about one file compared with itself?",
        explanation=(
            "A file compared with itself must give a divergence of exactly zero and pass any "
            "threshold. If the tool still says FAIL, the tool is broken: inspect its threshold, "
            "how it parses and normalises the logits, and whether it is deterministic, before "
            "trusting any verdict it gives on the builds. A tolerance meant for another question "
            "can explain FAILs between implementations, never a FAIL of something against "
            "itself. It is the A/A control, applied to the measuring tool.")),
)}
