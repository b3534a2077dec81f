"""What `hcqr eval` shows while it runs: whole lines with the running accuracy in a log, a bar on a terminal."""

import io

import dspy
from test_evaluate import CONFIG, CountingCoT, lm_answering, questions

from hcqr_dspy.evaluation.answering import evaluate
from hcqr_dspy.evaluation.progress import ProgressReport
from hcqr_dspy.evaluation.run_folder import RunFolder


def test_a_log_gets_whole_lines_with_the_running_accuracy_and_a_resume_counts_the_rows_before(tmp_path, capfd):
    lm = lm_answering(lambda i: "ABC"[i % 3] if i in (0, 1, 3) else "B")  # gold A B C A B C: q2 and q5 wrong
    folder = RunFolder.create(tmp_path, CONFIG)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        evaluate(CountingCoT(), questions(3), folder, "cot", progress=True)
        capfd.readouterr()
        evaluate(CountingCoT(), questions(6), RunFolder(tmp_path), "cot", progress=True)  # resumes with 3 done
    out = capfd.readouterr().out  # stdout: stderr keeps the one-line errors
    assert "\r" not in out
    lines = [line for line in out.splitlines() if " questions: " in line]
    assert lines[0].startswith("4/6 questions: accuracy 75.0% (3/4), ") and "s a question, about" in lines[0]
    assert lines[-1].startswith("6/6 questions: accuracy 66.7% (4/6), ") and "left" not in lines[-1]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_with_the_running_accuracy():
    stream = Terminal()
    report = ProgressReport(4, [{"correct": True}], "question", stream=stream)
    report.row({"correct": False})
    report.row({"correct": True})
    report.close()
    shown = stream.getvalue()
    assert "3/4" in shown and "accuracy 66.7% (2/3)" in shown and "\r" in shown  # tqdm redraws its one line
