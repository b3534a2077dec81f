"""The DUR judge: an LM labels each question's retrieved context as decision-useful or not, with controls.

Decision-Useful Rate (DUR). Labels (HCQR paper, :mod:`~hcqr_dspy.judge.labels`): ``ENTAILED`` — the context
alone implies the gold answer; ``USEFUL`` — strong support for the gold answer that needs a small inference;
``NOT_USEFUL`` — otherwise. DUR = share of judged questions labelled ENTAILED or USEFUL. A judge reply outside
the three labels is an *invalid judgment*: counted separately, never mapped to a label.

The judge sees exactly the context the answer step saw: the row's shown passages (after the token budget; a
cut passage cut where it was cut, :func:`hcqr_dspy.programs.context.shown_documents`), never the passages fusion
kept but the budget dropped.

Judge controls (a DUR means little if the judge calls everything useful; :mod:`~hcqr_dspy.judge.controls`):
with every question's judgment the judge also labels a *positive control* (a one-document context built to
decide the question), a *negative control* (the context another question of the same run retrieved) and an
*on-topic control* (passages about the question's topic, retrieved with a distractor option, that cannot
decide it). ``hcqr compare`` gives the judge's accuracy on each beside the DUR and flags a DUR whose judge
falls outside :data:`~hcqr_dspy.judge.controls.CONTROL_LIMITS` or cannot separate the real contexts from its
on-topic controls. The judge can also be measured on contexts labelled by hand
(:mod:`~hcqr_dspy.judge.agreement`: accuracy and Cohen's kappa). By default the judge
reasons before it labels (``dspy.ChainOfThought``); this and the judge LM, mode and controls are recorded in every
judgment and in ``dur.json``, and a resumed judging with other settings is refused.

Two modes: ``context`` (one judgment over the shown context, as in the paper) and ``passage`` (each passage
judged alone, for finer attribution; the context label is the best passage label). For HCQR runs, the role
shares say in how many decision-useful contexts a passage found by q1 (support), q2 (distinction) and q3 (key
features) was present.

Modules: :mod:`~hcqr_dspy.judge.labels` (the labels), :mod:`~hcqr_dspy.judge.controls` (the controls and
their trust limits), :mod:`~hcqr_dspy.judge.dur_judge` (the judge, :class:`~hcqr_dspy.judge.dur_judge.DURJudge`),
:mod:`~hcqr_dspy.judge.run_judging` (judging a run folder into ``judgments.jsonl`` and ``dur.json``),
:mod:`~hcqr_dspy.judge.dur_metrics` (DUR and its shares) and :mod:`~hcqr_dspy.judge.agreement` (the judge against
hand-labelled contexts). Judging a run and recording it in MLflow (``hcqr
judge``) is :mod:`hcqr_dspy.workflows.judge`.
"""
