"""The lecture's ten self-check questions, sealed (grading.py beside this file says how).

Written by `python -m lab.teach.selfcheck.seal PLAIN.json` from a plain bank kept out of the
repository; do not edit by hand (a changed option text no longer matches its digest). The
options are in the plain bank's order: an attempt is recorded by an option's index here.
"""

SEALED = {'format': 'decode-lab sealed self-check bank, version 1',
 'salt': 'b024e7662ce2603cf7540349c42379ef',
 'questions': [{'id': 'q1',
                'section': '4',
                'form': 'choices',
                'text': 'A captured decode step gives a right first token, then fluent but wrong '
                        "tokens after it (in this lab's demo the replays differ from the eager "
                        'steps from replay 2 on). Which of these can cause exactly that? Pick '
                        'every one that can.',
                'options': ['the KV-cache row address, computed from the position on the host and '
                            'frozen into the graph at capture',
                            'capturing ran the recorded kernels once, so the first replay did the '
                            'step a second time',
                            'the position advanced by host code that runs at capture but never '
                            'before a replay',
                            'the input token id handed to the embedding kernel as a by-value '
                            'argument',
                            'float32 rounding: a replay adds its partial sums in another order '
                            'than the eager launches do',
                            'a dependency between two pieces of work in the step that the graph '
                            'does not hold'],
                'hint': 'which per-token values can a capture freeze, and does a capture run '
                        'anything?',
                'key': ['24e1fa1f8cd40ec448f46bd4ffdca395',
                        '37d826f72a52aa5b11b4f8d1333b4ede',
                        '476a8943e1dda829823f27b41726eea1',
                        '8db9510833081934d3df9093d97b9740',
                        'b37e11adbae19db261ca0929ccfe3c35',
                        'b67906830453a6e056f3006bfb61b18a'],
                'sealed': ['aPPz+0HeM4iLxLYvXgRSDuwj0Gv/YflZZBRNFB48iZmukxsY7yHBvZhlgZzG54VBo7X4',
                           'L8mCp39cFsx9vHpyAcp5uSu6Y4V9nGOXI4360kbVh0VRvZ1WQ5cOrcR/arZ6MhJG2Nps',
                           '5tH3mKgFtQT7xBvHjGK1gDmiZ5IrXwCg9Nq4N0o2nrlu2ZKV8rZyTx3w9R8MEccAMJnd',
                           'vyNdc36fxfadKx7yjg4Q4/dFZ52s+2voVjXEkZI26PwoCYrv8p+tdwmu/IJ8s25olBf0',
                           'f9+ZhFk2TbnA4o2/rAf3INy3KWLRjMxE+DXXXdjCPYoVAHvUf0wiX/DlqjqVoqAX59zv',
                           'DjO0QaeNtILGXCmsWzdPkQPCdCPRk8spXJzsJOvgJODlaRB1QdIC2+iK5TSQH11qAsOS',
                           '1m/rxydrZ9+meflEC09sErxtI/I7rq3rNAuho+RrSvXrcMJCGa2kg0KhE+4880uF0pV0',
                           'oz3H8tiG98f8ALrkoQ2LTDzbuLjArMOXNX7gOJN+tE8YX31p0drCoXaVwH7j6q8K6KyP',
                           '6fQwe8st4uqZ2+gQ92ygspKdnrk/rjQ0NI7Vp2UAm/p9hiIukZqN6qRce/pX5SZB2kM3',
                           'BZj5YvNh3idqOazuf/vZwDeY55humCTeTzdFX6BWpBLw0Qf4D6EX3YD1rfoo+qie+XJD',
                           'HlZDJoJjO6N98tGdsMwZC7f3eNbJcozrx2W4+K73AHnFbfxtHUT/2/oEwHLnGX25iUf/',
                           'pFOnJQ85ZCjfONcyEjEFZF0Jd8zUPo+MV/GNbUC8WoIlSAsdeuM4DiNJgvbeYCmJSy4p',
                           'FuBwYD+2h20mtlLR1LgftXRpYLLuYKGWVx/roT3iu5/v6S960me5uv73JN/W421k1tBX',
                           'N1wXqG+nGKcT4G7f/q+iMbIgFELddB48PHwwmx+asLfBXnLpOH6aQLA/3V7mqMyoWpqX',
                           'N4St5Y7ajCMhqk33mtfrSkwTeXLG/9GuHPgURDGYUXb49Lj3wW9DY8elHwwvs3Xh/KTf',
                           'u1HSVScHl9Vbb/y2JATIaMuEfqEC53lnWO/s8C3a7Lvj86BITJS+ylKChgqjl5Dun3XU',
                           'YS5RAAYQ1QIzEDwzL94rgRhfTw==']},
               {'id': 'q2',
                'section': '2',
                'form': 'choice',
                'text': 'This engine advances the decode position with a kernel inside the '
                        'captured step. Is that the only correct design, and where can the '
                        'position live?',
                'options': ['Yes: a replay cannot see anything the host does between two launches, '
                            'so the advance must be a captured kernel, on a position that lives in '
                            'device memory.',
                            'No: each launch must see the current position, whether a captured '
                            'kernel advances a device buffer or the host writes it or updates a '
                            'node parameter.',
                            'No: the position can stay a by-value argument of a plain captured '
                            'graph; the host increments its own variable before each launch and '
                            'the replay reads it.',
                            'Yes: while a graph of the step exists the host may not write the '
                            'device memory it reads, so no update from the host between launches '
                            'is allowed.'],
                'hint': 'when does a replay read device memory, and what can change between two '
                        'launches of one executable graph? (notebook 11 updates a live graph)',
                'key': ['0591e2705d044db15f50562c43693109',
                        '580e9304430c5eb6dc33ce313fced51d',
                        '6005c7bfffa1824b4f24585001567dff',
                        '65c4bee7d45ac0c8152147ff63ee051b'],
                'sealed': ['LZ95kUYzv9l6bpLSE6XymbRiqmKrcIUiVBe8b3edmGd2ZY9sSfHucAcUl8ofNtQmc+Wa',
                           'pYP5zFDwXeymZ0GzmNXT1v5RGEnS5VGZDoJtnoCQW46vEA1mOJ1Aq16Uz9XJNY6qij6W',
                           'HToLs07Y3+IS7u/M/CmWaOjuOSaxXoe61aQTq+UpXVQH4ou6XltizfH0vrIonoHJ4xTk',
                           '23iK4yW6U+ACKeNpuo7H+P7x85ljt8PWTsqMni1MbU/qpLDyZwQoX9592C8MYVf3xFAS',
                           '0NwFMsXlvBfB9Bv5sZTvCFfQoR+uGQDrhMvtcZT4Db3VLT6Mmr4LjfDKVP05O/GaM/FV',
                           'yvmo5m6Ee90ejo9gdihKUmHxCESc1LhWsvAVtUDYOIhk4hstB7EyzrkV1aAgJASAAvVq',
                           'lVWANWCnMxdGfRq55HZF/5EiMIR4bM0lK/BPTnX1SYVuzP2/ZyJRhTlry7Q3wqsjcmVY',
                           'BIC1FVViyHwfvktzZc5HdFgo36VjeEpfNt5MbJiGmG3yr2DY9N42CJE+I/HpsGBaGckC',
                           'GLG3KKzB29SHZRZWjC0xEbw8FJzfVWwLpkPxsAHW4oWC0ciV/HK4lmifMtLxMsI8vCxk',
                           '74lBJ+zBhDs+dd8BZHS3XxgqvswoZT/p+3l3vkFuTZrZ7jjPTNPJtMSsjD8+cL2r1MhM',
                           'PWVra47t/tQpdFSaSnKEn2vs0a031Wgl80elIC4ERTkRc7idvl5fh7Zj88RxzXONCuKk',
                           'eYoFOFTOaS8mAx8shUJXrCby/F8K6BRKVeM8mVjArHhNT0xanOOmrXjL2tWy2hXfxg7B',
                           'wWtHyxe4e0YgbuGQFso65U4ZPEBPDLrM+IuHD+xrjlqMvWST5jP34jRxLDMOWs+7Bb+Y',
                           'hB5lDfuh+yTkmtO+XNRv4mRj73T6QEL+rL2NnGWCUrMpj9UgjYd/pxucF8h3/G6TxXvG',
                           '8yHzheVr2CJRwhhNOKZpIYt5OmpWpMpUVymoPIlL+XpUnyJseQnnCjQlyY7N9rg97yea',
                           'CJvfMe6S9TMLhMTjmNRbRqrM02bHM+EKn5Vm4qi1F+GBigKM6MvAT3tWFDsmzi+u9eXG',
                           'BFi1bKnuRVzoMrxLqwuuXzT+uEzvXp1kc7EHUv/cXknkEtYeQk8YoZnFCu6Pu2Ol3np5',
                           'lpSqp51dyDpq96MwACS/4FuQzuwwjGdg3beB5AhLX50X1QdsbEvIkozk514NkYVH/WWa',
                           'A+hP8N5tfQlxnkrzgFvQlAqWlDhuI3S+7y+7DfgWhIDhmd1x1WxwUyrYSmUVcSvgi7S2',
                           'qKwMlApdtfAmxB5WGax2Uh9Vc3X5jPCH4BelS70x0JRjJck=']},
               {'id': 'q3',
                'section': '2',
                'form': 'choice',
                'text': 'Inside attention the context length is only a loop bound; the number of '
                        'splits sets the attention grid. What do you do with each before '
                        'capturing?',
                'options': ['splits: the kernel reads it from device memory like any other input; '
                            'context length: capture one graph per context length, since it '
                            'changes every loop.',
                            'neither: a kernel cannot read its own loop bound from device memory '
                            'at run time, so both become capture keys, and every new value means a '
                            'new graph.',
                            'context length: the kernel reads it from device memory while it runs; '
                            'splits: a host decision, one graph per plan, re-captured or updated '
                            'as it moves.',
                            'both go to device memory: a plain captured kernel node reads its grid '
                            'from a device buffer at every replay, so nothing ever needs capturing '
                            'again.'],
                'hint': 'which of the two does the kernel read while it runs, and which belongs to '
                        'the recorded launch?',
                'key': ['17bad4937f7ec8f9afa7e4045ce13be9',
                        '9d8d1b417b50c9ddcaab39334bb14703',
                        'eb71f0ef99c367c735cc94463693105c',
                        'efe5a15de9c496cb05fedfb8572b5b19'],
                'sealed': ['KqMwTQSeJiyYWEV6Z7Fbh/co8c38w0ywz5LmUIPFrLmMO/fBy/xk/4JNMK9u8u0/mGlh',
                           '+VTeXMpvjbRsJtyGPMJR5PV6Fj0fjqwe9V/TF0pzwUYXKS0THm/tRCEB21XyhRlC3Xqm',
                           '2k1bZSeojgF8TwR1/lCPd4Vpe6MazF3K5rsREqt2o+WSLyUE2STUxozCbqRCwBYmt6at',
                           'iZ7WUGFzEp6US/SqBEBKe/LqfeHUhykFzjsYMbrM/UseaEMWqG/UkkOuf/ZbLntU/tpx',
                           'SPndKBSD09f5Uw44vOGAvstBTPN6OIJFKjcoNKQNSZfMfQOZZgLxFOfBdXeX+37T5uBe',
                           'W1SHEN0qtZHvk3QcK5OiR+wTfXSUe254GqKoBiPURMulXmGlEMKSD/erly0BQn445TCN',
                           'EFweLu9fVB/jhtH90YUFp/97XFbJG6fvbUC93IyzAyc01bEd3aLjkt1rQl5hpWSzyw83',
                           'ne9R2YgpulObdY6UbUWewhqXlbEfHQoxkW8WAoO/Uzy0p12ID+sZSzGbGR2b5pNlEDHS',
                           'DDHd8CqFF+etToUgRm9EADv3LrrkNM2UsBL4KdGuJFe4UZMbsBcO3bKMG7UWC0X4yjJV',
                           'MRbzGJLIQqkBEMgMPff9Zy+RgudmVwSMqgk9HxYkbvnhXODOSf/pF2xpPHeEwWmzffLu',
                           'm3P6KiekNfWUhHYtrDLxJVeds3/GMpOOOP1a6LWvxGZ5Z57qXPaoDnsS4yXXPbXI5xr4',
                           '3b9UByvdvQIaFNFt8tkK0TOeEF2DC+DqQkO+0Uobo6eQS7+eT4eWBVWurfBu/IW5KURX',
                           '599uqHKKOi4d/k9B7rIR7PuSR0aMUdZFl02jslrQ5O02CVAnzPcCzwY2hDW0zYJZ9J1k',
                           'TjI6pbVxFFCSJ0FOEwS3yGiKSjxqLziliLhbXfhJzI0KTjJ7tdUBTuakseb/Wxskx7kj',
                           'PMHC6hGzcKU1lWqzrjsDT1vSEqTHUAU6TXSiNYj0jU+psicHoMQFc5VBjhXNYu1wsUvs',
                           '/26+VUtnKrVaTYPWcRkanUScWGIWTgndVkv+FdeqQq3s95gtIw0ngi8QLGedMLReNIsz',
                           'tK9uKJiezKfXX/AH0EO11l/lwwzhQBIXSdFTfyjCu4d1RaRxZmJJ7v+UFs4h0+t1yUDx',
                           'lsraO+WtC8f6SxsuN+Owa1xYjcYoqQpd2N4SGEZhrqO8921XBgwTDEV9LXvISq9ypWMQ',
                           'g2Mmo7tG949Yc7vZOzPwuVfGcETpjkubklLhtr1R7/MRO/+intYjN61f2bcG7ScZXEoC',
                           'jWACWyq6Pg+OHSOrAhO37oWNqYenmC21sujlu4xmrUgqbG/g3FQEqgc7cUiQbQ2tS2y0',
                           'cCeAUlEf14MHuXvoQrzThjf0luEeRSiU0diJcV9JEhgkHSbvRnjPNvAuGnmLkRvLA+9K',
                           'WXCGP3fZ5NGvwRFrfDVYeJsfbkhkzONqnJSVUWCcD2TrNX0jCod5OyuM7bXRf+dolIIs',
                           'wJTGB3fl6WR7VqfRdeQROuw7jFux9u7AfmSyUZM16P0G1RvbMXOEmRBAXTS+Fny4Jl4A',
                           'i3JsdaYAKGoRitOWPA2VLj3jnjgMAdfuWU+nktkJqmAxkfkKdnqXe0v8I6k/Y7GCX6pz',
                           '6zLGOOB8AZoKOLEmUbd3hNU48onTJBHFht+nCtiF3ry2gXS6FY1ohYjIvOXaPfdIUxEW',
                           'KpAl0N1nwZ9kuaOdXsAO1bicMLZslpind7JBPIzohoI8r/V1ttulICw6poFezPcQ4aN4',
                           'IVI3']},
               {'id': 'q4',
                'section': '1',
                'form': 'number+choices',
                'text': 'Graph capture cut the standard error of the mean per-token time from 0.55 '
                        'ms (eager) to 0.02 ms (captured), with the same number of reps in each '
                        'arm. By what factor did the estimated variance of the per-rep times fall? '
                        'And which of these are consequences for how you run your benchmarks from '
                        'now on? Pick every one.',
                'options': ['Keep both arms in paired, interleaved reps within one session: the '
                            'eager arm still drifts between sessions, so an old eager number is no '
                            'baseline.',
                            'Measure the tail (p99) on its own, over many requests: a handful of '
                            'per-rep means and their standard errors says nothing about it.',
                            'With the captured arms this tight, smaller real differences between '
                            'them become resolvable with the same number of reps.',
                            'Now that the noise is gone, one rep per arm is enough: drop the '
                            'repetitions, and with them the standard error, from every report.',
                            'The tail is compressed as much as the standard error, so p99 can be '
                            "read off the five reps' standard error, with no separate measurement "
                            'at all.',
                            'Compare each new captured build with the eager figures recorded last '
                            'month: with the host out of the loop, drift between sessions is gone '
                            'for good.'],
                'hint': 'with equal reps a standard error scales with the standard deviation; then '
                        'ask what paired reps protect against, and what a few means cannot show',
                'key': ['1644379a99970ee136a96d88c1d87c5c',
                        '58d691a88bd88a6199e849903d70af6f',
                        '7ef4c3642cf0dc4f277d7b41b9db0089',
                        'cb0b8f40a2862358734fdad4723ed0c8',
                        'ecdff7832f9444b26e1d7a4b4dda02af',
                        'ef4274a1f1782654955b3f041a931c04'],
                'rel_tol': 0.02,
                'accept': ['0516216266e0d622990b5e38045b462a',
                           '0be696b12b7159d53ee7cc0eaad264a4',
                           '0edb1eb8cf751f38b4387c80a97d42d4',
                           '0fd6884d88a629fad57ec54dd3a91498',
                           '10a839066729dddcaae80ac257d81ded',
                           '126427a796c092c7a6abcd6abdf84b5e',
                           '13f188cb80a639bf38ac57270e986dc0',
                           '154b769c53bd37d88e22483f342aa57b',
                           '15f95fb0e1908315f23f4fd325004cee',
                           '2064ac8e3ff2c0826afb3b0f764139cf',
                           '2597ebeaf471104345976fa292ac7db5',
                           '275e7e88f081b4f8df020db0febad5c7',
                           '28edb9c19f0aecc7841fd0fd57b76596',
                           '3bbd8a6f820815485e43ddbc6a467e0c',
                           '472728b6ee2024bd60ea571a4426fca1',
                           '4ae0c0d93021a9881d41f619f475676d',
                           '527445ec0dbbbbdbc9e7df15715fec60',
                           '52fd24c36ed51939156a8b41191036cf',
                           '548e3240f777d8b8fd00e1c899a8a8c6',
                           '65db05ad8cc04a3852eb23ff7892b5c9',
                           '6aa18bdf2d34a5251d66557dad67f12d',
                           '75ef6e51c6c06993fc9d2e5b4b36a059',
                           '7930d3b4b16f9c1cb570f2dd4db1de55',
                           '7a8b86ec7f695e0dec0ae74cc5257d04',
                           '7b7965071bdfc545c525019068ed504c',
                           '7f518c9829457411b5b3c291dfa23534',
                           '84267cddb72509f05c36d16cf5d608af',
                           '8db04de411571ade4fed97e7b27561a0',
                           '9622de3057d711ae1acda06dc4cca00b',
                           '981aca5574c731437ced9e5df38f80b2',
                           'a4d84af07d7f0c9a2af08f09ec847208',
                           'a8d96fe3ca908fb8a3949ae10739f04f',
                           'ad75f38ef1cd622a6a7e7ad4dc4010e0',
                           'ae8f97893284a4675ef976cc08a901b6',
                           'aeba32ad1050911ec896ce7558fb316c',
                           'c20b4a7003206f4ca8af3ff1b0b4acd2',
                           'c91a96f654279f412956f14c28dec5ed',
                           'd217f9e76d0436b41d27ef97e52d0c09',
                           'd9d5399d36440bc8278dc439f407c7d4',
                           'eec7178465dc9919e3ffdd6cf7dbf971',
                           'f2648047c950839aea522e33664085c2'],
                'sealed': ['GniGS+rcWJ+cQOjjKt0R+nYTmCsqwlaKT+0e0oTtaV26vb4NSUtYBZMH6bfQyclrzwUM',
                           'uFfNZSJMncHEBElkB3y4CxMgoFP4ovRu/pzEiGA8xNI7BaId0CmS06P3NzHEc/CinrIM',
                           '5FNbUOEBjEYPeCnvudsC6sJRjjz5PWcPJbePx1YMT6av4wv3th0UDcop8rr8Q4XNERTE',
                           'IJ7L8t5GF0nwPkXfZAiQcsLIxInVm3QLmSFMfmWZ0KWhPa5eu5GDEX8Sj48Ke8HbpsmF',
                           'x86vT/PXXVQ0nj8Bom95OlzgQXsZTfTYUAkousQKN0SxN5KJARgJpmQr9dEZNrENHc5e',
                           'dZ+8rAxDD7zp6sccam7xTTjdyXqpNDET1NEOVWRzcUxvMY4sg/DjHvUHFcAhQJoPvq9G',
                           'FS/Fc4K0P5BdZiA/BPMzYLuQ9mTMRiPeT2lNYQfn5LHJ8+7vgyHs8fwh3iMaVjiO2ZGO',
                           'ppoFt0YlCqaVhu9jsPQAuHv8WpCLK7x9s3bVxzCYKtQhtvdBfOiEqLFThIymmI3flvO/',
                           '+XI+sVG6vX+JD0pw+g2O08wsheFuqPlVk0Dh2oFiP+zKWyrxZrOLY72t87PMWJwPYSjp',
                           'Y2dsCNM1jx+zBaUxjdwx3r0K7d3yaB15iU18zcUzvxN45sZhi29BFBia7MAYg9IN7eZM',
                           'kUeBIbUFoZTTme4DSx1XjvFbqMd7PDv15XDkfttJ1xVwcpYjhnwEgkbFxYae6VJl3PS9',
                           '5Ipi6XiRihk3p2Pkubhe990RY/6mrnZnJ29L/IDMbpKjmBZ7VdZLLGxDHz2gOpvM/mqs',
                           '9uFxK3qsB7Sys14Om444OUMzdRpXVJDFQx3twJjLw7Bl2aO95KOFrmg/6o38i83UnvIW',
                           'xrnvOrMl2RxHSib7YzFIWNKLJVsKXBYZmF4VzwqWIj5Njwl9XVatJEHZxXge4q8lU2A6',
                           'XeNx8/e8KqKn6UlIJh1OEyZo6RhU1H5dDO6zk3itPLuycQnWBS8CUgb8VeRMNyKey+5f',
                           '6t4XkY7gi2Osoq3+t6NMYyrcSOKKjL88TbgmDIbfFatsKu6KM7CN+DyM6Sx0FEtta9ea',
                           'j2R5T3K+Vuaa0ob0J2RZ9B01urLOyA/LgalFG8xYRkSmvfrdPxxT7hLlj/U8qRlxqtKE',
                           'iVyKUp8MuRqBbhP9R0YgotYKhoISwxOw5agS6H3cylIqbAJq3bFFnRq+X7qoWSK/PGR6',
                           '1lJpByN2l8PRhXhlZbvTK/qZn+tPDGVUdod8170d9x2DYkip6kLNttq1sFbkRl0wMeh5',
                           'PGFB2I8AXpwaNAggiu+PauxsIpIGBSPOhdE+J4t3qRyOi3wMyQ0icwUFbhiQ2bBTAncj',
                           'xr4hzoJZ9EkUBkH9rO5208XbfH+cH86J1nA1wWdIiF2oCWKeBnHi+78Sa6Mya9NrvozH',
                           'UbUuKVOrDg5bdlqsaPbRhrEgctiF0BvuKZvtHw==']},
               {'id': 'q5',
                'section': '3',
                'form': 'choice',
                'text': 'A table upload made lazily on first use breaks the capture at the first '
                        'MoE layer, yet the error message names the MoE dispatch kernel. Why? (On '
                        'the word: CUDA calls an error sticky when it corrupts the context, so '
                        'every later call fails until the process ends; the lecture\'s §3, "CUDA '
                        'errors are sticky, so the failure was attributed to whatever ran next", '
                        'uses it for an error that surfaces at a later call.)',
                'options': ['The dispatch kernel reads the table before the asynchronous upload '
                            'has finished, and that race makes the dispatch itself fail.',
                            'Capture recorded the upload as a copy node; instantiation accepted '
                            'it, and the node failed later, when a replay reached the dispatch.',
                            'The illegal upload left a sticky error that corrupts the CUDA '
                            'context, so every later call fails and the first one checked takes '
                            'the blame.',
                            'The synchronous upload is illegal in a capture: it fails at once and '
                            'invalidates it; unchecked, that shows at the next check, after the '
                            'dispatch.',
                            'The dispatch kernel is the real fault; that the lazy upload ran just '
                            'before it is a coincidence of timing, nothing more.'],
                'hint': 'where was the error noticed, and where did it begin?',
                'key': ['35f809c5aa63c2bcc87d22fd086bbb5a',
                        '39b0ff66785983d329d2068d42dec5cc',
                        '80d3c3fb5dfbf89c47d71ae8fd4743d3',
                        '9771d4f8311177c98c51e930acd698ca',
                        'f84be8b99dda49947c970a09677ea60e'],
                'sealed': ['sfoLz0fUA1FHSBGgQ6CNpFHd77bXXooBxHJPxrTxzIHOJUuY7viOPhJMFeNT9HB1qmsc',
                           'Rf/qVf//jO73XAsFml8wjbIfQAe1H/jrKlvmIPRmStFtmOOgibqliCR3cWdcACW57qj1',
                           'lYJ3ifwjM+VhfLfpjToSrIA89lCl2Q4t7MHbX5tULKQQbm8H7FO60hNzWS7BRKfbB6u4',
                           'LEGawY37kCSU+nmXW8cjBIeGsI5fbeSSsTypOJ9rvPpGm2vZEQQNg0hSj4J3Af/lbCD6',
                           'IsuaraAHr2alka0aYQ1vH3UMNUSmjrenHSk9mecJuSgcuYMZ1wK7oITAyto4VBzRWQO9',
                           'rrMSFrKXlUfxes4A0DDxI8PKn7OpwmdZjrtJ9hVc8ielP62UIW2u4MJJGI1nbcoB+F46',
                           'BksKxGaJh3+MJAwRbVpUWKswNSyAbn3dbfKCRnDeHfEwsUTc70p9yfxhEVIx1BJ0S+fv',
                           'dTriSjcWBNuAk47qmqYWj9+7eFlJu6/8I8M+OfLqxx1hdOoIanW25+TNBW+7xEJsyn5V',
                           'rMwhxpiuhzYwEjbPMuILJ0qAXab1cDe83uKheUQmwNqPHHiabe0Fefuy8WsgdlCSBYf/',
                           'o4EpqU84McatBUeaF5lUj2TNQa2qzbzZn+hNA9fuIGZbDEuYCbiVqANmFwirPab3b3NT',
                           '/MyPZpbsFlqHNJNA7LPWSYQYgE+FAJ741WodqMqdjchDT2iLRXrdTsmMS65sXk6gfexN',
                           'f5jtOBmL3J9FOkFgZNE2yziIRMy8dQbT394O3xdpU9A9Im7mp8AIfp8JGqv5LVRbKpNV',
                           '6i9EH0juZMSxF4CqImFMBCGaDjViSsNAPurjq8tqu/BcBwxrwpwgGeDpq/6w7ZSoVAH7',
                           'Z7qEem+xbDOw/8PUIxNtKMJSB+uc+JpmLxqC8E9PRlDAnckpNKeHC0GHN1JNrznidzlV',
                           '8SksO22Q0msjEvJWZEDMvD9FVcstEfBw+eSOTlOxbVJ5kL9gVPG7QDaYWlXwZFpLO4FV',
                           'UvCkK7WFYlg++ztm1CbE9tPYSLBqr3If855TxBadMwkjptNcREsEq13Fzzu188kBqBy5',
                           '0wPLkUeFzaV3ZgSmG3mSGLZ1XJYv5K4zN2x2b1MIWwu1stWyAIUIM3HRoZbPVGZDDzcT',
                           'cYtRoOhgdm71fHR2xSjNyiq8e1uPVRtMkkbU96aM+e03cMyifqwwtVuFKvi8XiFrhngb',
                           '4cKyNm8VhmqgkDSlKq3j4Hm7XT8pbHHFv89rAScidUQct5LcVgjU79dVjVLbwayaJUwJ',
                           '5tBmac3awUP2hKoipnxY2+tI8woceOjjUln7Mu51kslokz2n2XbCkuEAf+Ups8VMJifx',
                           'LsoQ9hjsAnlbBj4WmzycWKUgidR6BWxOYL88jNJi6yTZXnM7UwmoY0HBKJC2eGYRcGIY',
                           '52c5sTqj2XVuvcQMstNJzwl7rJdQyXZLi3alSax8qo+4TGxGEpjfkssOGu4yZYOyMuyn',
                           'vU2N0SwzTxT5p0/ewGflFHRuj6St66zyPsP6ULoLGsptz3ztN9nxgWYqNsU9SwDjhGcA',
                           '9Vccg6g1yUMSXf3XLrdflFWXUmAJqyyk/b0H9Oy/L+aA8aAS6JBjq8tkHgUoxC5rYslS',
                           'GO6CbQihgBmOnIMNkD571G5kQsBas9m8TCb3Z4ybJLnAVMirok5GXqSh6LWgDEm8Se1i',
                           '1KUtBHgIhvvTqj0s6xvbkltJH/Q4b6ad3M3Vp6maL9p/14nIow7BN56v8Ac7sIvQTTlL',
                           'kdsBdDNZifPbYhq04XfnEhb675PPHefpKmne8GN3XNcn1YsiLfs9mxJyDsp5qQzeBVZC',
                           'bmw29rUVFuOmRegGOqo3a6gJ2ueG3pjklRTbGCm0DxSMh5Vl5KSDFDhnm/IgWrKdEYxu',
                           'F8ytjS7wObMl88ZOQkKWaUhr9EdRXEohpip0PdxuFirt+v9hkDIiiVIXi5xrCiARVHVt',
                           'DIVFV2fD7j3hk8iOhsYm9JO8wHWZTjc1IREkAXHe7qmnlc0sfBIItUhP/Nk1teLBAXGf',
                           'UQZ1+ihMIQCxYm4A+eGQ8DYEIjzddjejg/LFg1M1vHZL+dEHXQ3Xw/2hmzU0gfXaT46P',
                           '6LPbMV43k9V0yvheUR9Imw1BMZUMAG4rcEHgnzB1OvNRrQMxd90UNUaHS0lVwnO1oiSs',
                           'kV8a22hFPM/yWHwMepNb/VYypUEuVgg5iErnO11acj2OFNKWQi9ZHaCxYb3L0dwOins4',
                           'pcDwGoPR3jmf5MzoVs4s94ZDv/uavUwScVIKqamAgmL+u4hcnj/g0puCFwRE1pyhUYer',
                           'aRmKNStHkpZTygwq7rL0DfEcCsKFjD+XYNggbBj0C4MyYsQneIkV3g==']},
               {'id': 'q6',
                'section': '5',
                'form': 'choice',
                'text': 'You byte-compare two runs of the same build at context 128k and they '
                        'differ. The benchmark reaches 128k by seeking: it sets the position '
                        'without writing the KV rows before it. What is the likely cause?',
                'options': ['Graph capture is broken at long context: one of the two runs replayed '
                            'a graph that was captured for a much shorter context.',
                            'A seek invalidates the captured graph, so one run replays a stale '
                            'graph while the other one re-captures at the new position.',
                            'Attention reads KV rows nobody wrote, and unset memory differs '
                            'between runs: run the setup against itself (A/A), check '
                            'initialisation.',
                            'float32 rounding is not reproducible at long context: past some '
                            'length byte compares stop working, so compare with a tolerance '
                            'instead.'],
                'hint': 'what do the cache rows before 128k hold after a seek, and what would an '
                        'A/A say?',
                'key': ['23c03cca68caf6501d73bddc6374724f',
                        '30e94fbf983d841a58c4fe3c635bdf9d',
                        'a7331b1c6963c1de29b4ca037afe9c0c',
                        'aada5dc16eb687b55fd4bbac3c48d0e3'],
                'sealed': ['Sy5QrHW51jcNp90qCCmQdCvcTwhSfXlStRm6b2p0ctig99AquFCivK7sly07QbAEGSt0',
                           'vkNZivjfElPskXuR+IPV5zdOi3nq/rQx225D9OjWyhmKJGWzJJbWAosT11DKduLJodr2',
                           'l7wnKOud7XtfFF8fgg7esGEOPHTcABowfJKBSMpWsfcMxSEKEurV2D1YdEhjT24UgueR',
                           '/NBdWwajQ+W5HrEH2LAottdtwQVobfx/ZOFnvy5O5WohLdE47xRQLU1VWu7sj6IYNjNR',
                           'CyKpAJ9G3XCjJoJGk3v2e/JFaZ9k82fjcTJpkAkI3WmMMS12m/8KM5odFBZovkDjKDxM',
                           'CyOBjiiUjsW23kMrL+1bYXwWSmEbnZweLQ+lyoZJbi44Y8oICaWvNdr+xErHKyZoQ8De',
                           '/vkaByNEiu6NkALa7+AOc9rW9aQd4SVvaEPr+gffRbBnp1RwhyVcHegvyR+DrJyL4TjA',
                           'lrX5s91jrRbEAg/RrFru9veabxK8oQxuAPjmWYq+p8XmketgBCIvCw0DKMgYMqW31xbM',
                           'HEv+yVORisdG4k2mvPLtyY0YmaDULJTm4JNGbOtLgGpOyMq36Ms/IbFcdLbKKZb5u/8Z',
                           'EKF5R0N4GG3U7MljhL82Inh4dmvEmmy1W/mD9KtD8Ls3dQmaRJ4rExaMxbwSHgzPuARw',
                           'm7mVyTQS7eSbTiIjcc+I54upfFGyT9dLDxdV60/dSYgUtJIliEEngUy+UoPD/ZOsfSj+',
                           'LDpvOP04eKEO0n3Dcy7Bi5ouL69TdP2MDhoIYdPqx9dlvpwowhxq67RvFPaKjH/37l7c',
                           'tTbTzM2HIFqs3R+U0HU8g08g36CMXAzj5Pms24+TlGYp3eZoVgtFixwQSliqHQ6DLnuT',
                           'g2Kze07+MZUZCtFBWQG91C6B4eB8euJ2X530Mn7Z2kzJPq25CEydNIUw2lKhV2O7EOPI',
                           '2vdiW/Y1zkUMZhpfCEI6KbtB1RIB9/g69YuA2OCKpHUA3WsTLdJkZRDnhq5Rva3cFfhx',
                           'GqEnYcidlAw3aiyYITqUwErNreMHcuxJDbXfXCJAKKuxPrIdjH6MKVEkQXKMoSm6rMrj',
                           '6fcfa1XJLXu8lU+kDDUF0aYv1zbB1/gJD2LDanNNmXk3oablqn9Q4c+h/rouFYZ6E+ko',
                           'Z5isKS9aKVb/FRv0YZZxQo1qlBhv9Jtr7P1NlRO1I9/wZOEPI4bXafLitbaAUPuNJT5Y',
                           'Mgu/z1s3lxE4rABIg8ZQj8aWvGkzsqH12P6E0oBb']},
               {'id': 'q7',
                'section': '6',
                'form': 'choices',
                'text': 'A one-kernel design was right while every kernel was launched from the '
                        'host; after the decode step was captured, splitting it into two kernels '
                        'won. Which of these other optimisation classes gain value the same way '
                        'once the step is captured? Pick every one that does.',
                'options': ['fusing two kernels into one only to save the launch between them',
                            'specialised kernel variants instead of one kernel full of branches',
                            'cutting the bytes a kernel reads from memory, by packing its weights '
                            'more tightly',
                            'an extra small kernel that gives one phase a better grid, such as a '
                            'separate merge',
                            "replacing numba's per-call dispatcher with launches bound once, to "
                            'shave the host cost of each eager launch'],
                'hint': 'what did an extra kernel cost when launched from the host, and what does '
                        'it cost as a node of a captured graph?',
                'key': ['014e70a9a00f84408cad223c20453e2c',
                        '56bcd3253a836545768bbd31b6daaf0f',
                        '65922d9ddc0f828e795050fa72eb24dc',
                        '948374286e67fd37800db5c73e6ee9e1',
                        'bbe2f609451b79e3217d95cba459d32a'],
                'sealed': ['u0sfXNpEZHUH9JynHFxWQjQ0XTtB2SpQInOtXKPF3juyTIS0Mp2AkP0CnvDPoVdocPND',
                           'H8UrCIb8F0QFFnfOK9+Ka4CDFvHKEa5hxCvasqIXhNLbHol66LBhUss4Ltlzh9tZCw8h',
                           'S5Z7sVVS7lcmhbW5oLYHWT8FGaeJskQpRK9sCjV53HMcS9DbTCF0+mJjRNhbVLUPcWe7',
                           'hzAb1+LJGorXH/6h3y/A5Mg4YC9/Kp6PzFlgsWtrBD77G1JO7oH3PnmGAxpDcgF+7jou',
                           'o6sK1UTw00Re0ln8PkclLLjfzx7yhDYtpCKQ+VG4DsPprSnDuZox4xAlWIz7aYRYi+zr',
                           'tnMsrr43rQGYhtz5f8b699OE+pkyYEApJO4rihtI8xMYUbwyFQ+y+0KivRoytnq2vW9r',
                           'pyOFpAhRi25Kl7TCWH4QA+BqpqIdRjSaG6ux9KWzM8ahzJZ5SOgks0GBP+9SEKOtslPC',
                           'CsHLSI66SDNXCKHO3SrVOeBoLuF9N3gkWuiO/lA5fPG0+evs0PQKshSQppNyk0kfL5++',
                           'l/y3+1iG9WUPo9OYHHFXr9IKcjP6Jzd4gFs61Gz1Fr871eTikvJuSSO0Y7aG7GEZ8uUH',
                           'TCjXxlCDIISDJZCIMA6Z0pDXMwSP2YOfpzAW+wDjn7xvBb0Fx/LauJ6SADbXRlUfX7iu',
                           'lX7+aVvN5niovc86i1rhDkumMk59BIe141Jz5cWyTm9vf4QPX/av3Ts2g04d91B9Ya6J',
                           'HDHJpVHb9kPj64jaj4HugSBy/JVascEqPZzACrMJOI+T68m7kCIKTIL6A3IsSkLLFCpl',
                           'K9t7HsA2FNRK8XrknUun2rTOfYcbvaBtiXVbW+jstbvSCJoojvQdv01xWWEmUwbqLZm5',
                           'iJxZv620IxTon+cyt+lxUBsWzehRIAZ21jedFHAfZwzKiko91swoXofUeCYdJ4MlOhPe',
                           '/wYqrzMWEKD1JGV0NFmjE+JGlTX9SOUnmshlR1NeWbQQnU6SIE4J41pSFGfHPzc5jyo9',
                           'BFd1Zo4e2fR4nZoiIselA5w4Fg1C']},
               {'id': 'q8',
                'section': '8',
                'form': 'choices',
                'text': 'Which of these reductions can you reorder and still claim a bit-identical '
                        'result? (Finite inputs; for the maximum, a fixed rule for ties, NaN and '
                        'signed zero.) Pick every one.',
                'options': ['a sum of float32 values',
                            'the largest magnitude |x|',
                            'a product of float32 values',
                            'a bitwise OR of integers'],
                'hint': 'which of these operations round their result, and which are exact in any '
                        'order?',
                'key': ['18979da8a3d1ffdee70ea91b9ec1a93e',
                        '49e4daae8b41e88a677b2b1c2c2c7d10',
                        '6e6923b7393c9a1b5e8d74e7665def0c',
                        'e74985457cbd1f0414031a46051f99e8'],
                'sealed': ['cMeJNIdI+kEEjxhhOtaEz4HxGphdQ8FWbaeSmNGmR8UgvyZTySuSNTiKLCx055VozLfq',
                           'mqr2cMsQ2hQBwoIi6tePd5KW2yi1nSotWY7SjRGmpkYCIl2hbL7kC62bUFbp0okl5kjQ',
                           'rEE3XSJVwCsjtJnk3zTTAZR0trt+UxNrIUOnVULqrdceYSC1PrJCFjp5vyeFut1wpkOc',
                           'JlqrOoU7QvKBMK2meqIzeDVtaAVUnGi4Bg8ANwlQKU+Xmm98sRxtpN9FUFlyGYl/G0e1',
                           '7zrrn57ybl25Glw9xTJSWMygXBbozqDwQCiajxYf9lK3+xqSV9Nf+G8CMjzcBulwiD40',
                           'yT6iL9NuZzqZhsrIJtsF2AvC8TcUDLGCTDwJqm5F8SFjBtT2pN4XDbhWixqFwwibYc/2',
                           'BcbQP9KVSBJ05VOmOykSdpS6yaAfGq78h7KoKrj7GI/cU3pzf2gNah4+WykAb1A8h5lc',
                           'S+ZqwKS90W2uXbVJD9WhOnl5GTdF2Cr203IjZ9bUoGkg+tOuieaCfN8AIloCRr+P0Ui2',
                           'Cx/dDgtC00QhU9DB9l48B1m/FOXtD02vsVVLFGTY0KSNk1MMPe5A0Hj6MiKrRp00hqGg',
                           '2FB5y+f3YM2/wLWopkWYcKcDnIcxoilRvRkZrRm0oXjMHacrDLLahsHtUctHef3FgAyq',
                           'nNUJ1xSkwxmq983vs3ymbPEyAPRusWM4j2XiaeoQaEaQ6539C24BJ7WHgEpQM+zVghaP',
                           '0RxjFdxfdDhMK12z0NbY7VdZS4HzUKLj2RII2TSNLFQptY4oI8n0Iy9x8Z+4uP76hs/O',
                           '+wrAigvw7P/aspYwm8JeOgkpaTVRVksnWeGNYhsNZ09EnNoYX8WnMeMO6e5I/jJ5mbw0',
                           'DSjsAaaneBCdVdea']},
               {'id': 'q9',
                'section': '9',
                'form': 'choice',
                'text': 'Your engine keeps its KV cache in float32; the implementation you are '
                        'scored against keeps it in float16. Your parity metric against it gets '
                        'worse the more precision you keep. What do you conclude, and do?',
                'options': ['Parity with one rounding implementation and error against the exact '
                            'result are two measurements: rule out other differences, report both.',
                            "Switch the cache to float16: matching the reference's storage type is "
                            'sure to bring the logits closer, whatever else differs between them.',
                            'More precision can only bring you closer to any reference, so a '
                            'parity metric that worsens as precision grows is broken: stop '
                            'reporting it.',
                            "KL divergence is a metric, so subtracting each arm's divergence from "
                            'the reference gives the distance between the two arms.'],
                'hint': 'is the implementation you are scored against the exact result?',
                'key': ['83e0691706ce2877225298dbdc9421ea',
                        '8f6054696ba8155542d5ac4390156229',
                        'a1133d06d961add278994966f0830944',
                        'dde78516a2a74158b38bc30e75a2331f'],
                'sealed': ['hgV7k+aZrACW8vVii1O75W52U6ikQ47a9bzjM5ylUVC3RqIlk5DgoamzixiAmKaiUwyJ',
                           'YPZmXEKFy5zaya59NhTgNKir30D8cabZ5/vYwh+un5Qs4V9M7U+UqgE2NdTg1WGGRDim',
                           'nG8fOQAYPNUCQ2vYXnSZARZpMBf+IAse9Y2W0QBCoEZpxGetj3e+ooUoZJ/arSqTCkLk',
                           'AeFvE75Kgz+C0BIAqusVKIxanG8/kpepvNy7dVCN3RHozbFcrlBIvWIhIFNWGOlYZbDv',
                           'MJRDxmFix5K2ht1Xs/Y6tmhH4jpj6NwafHa/W3gK9pyJleI3rd988gvysipb9sCmnyH6',
                           'cY8O1faZrW2/5lXOWmeRLtIyGc6/VS5dwskqH91C+XVMWfJKIxa2MWKMUFm3sUm6ne6r',
                           'qxqCl0FdQAIDxgatHO3kPO4CnwvPe9xLzVI0hOhov8MZlefuxuQ2QqphWmoF6Ff8yRkW',
                           'bbedvKSht0oWCs1xrV6iyn4ymB0A/gH9b8hQuNhCT2WbZFmaHAN/WksTaUett+opLKj9',
                           'EyFxqVL6McOMXMe4pNcQsiYipQMUr1dt257Aj5e1rWev3qVwZjwGcMte9WVRBED/ajLC',
                           'WEnKV0iOetzCs/yOV9sBNwk1jYxHrqfUH0RSstM+U+GFr+Q6BfVOI3abx0lKlhV0HF9q',
                           'AjEUEK5hs2gt70t3H8UiAX5EOiFzUcnlopxk+RyOZwDohKAy/B4iJBhpy3Ekca+QuA/A',
                           'zoe+/6+L4WSuRLA7uHqyQ1ESpc+hcHKq28CZx23un6xXPHuK2Qayu5xtEG2cIYYTA7NW',
                           'PkJHDbkBtzSJB+kLSM5MERxEYhiHiSWq8aHYJCyLsqHzaC5shjB0GKtjW/AGISOVYPU/',
                           '5ZnbjGeTpy58+9aDys4yt5aPmoDrnOoSI/UPQ0jaSxPamj90kVTj4rmosdy+mZZwTeMz',
                           'd5BY0JelraBJIyxLGsK0MoX5WcvsTezyWf6llW/nbLNNb84pGvQQBshnRNQrJn2rXbXf',
                           'Ie88N7NhCGV2ktT1ERbY3v/Gs9bleDALffug4tWpiRjcHvLZf63ER7ZY45C8x4+LD12+',
                           'zReeJteZmNuitCDMXQlwTG39ATi4E+iDhKAO5mC/owuYKSJmYtcVmMm0AwlPOVJCx3Nr',
                           'd657E6Rb47P9s85Sa6EKg/0BPm363QhHsrCHNb+KIkyBUEA7XcPNzWUBCyEwL9OimSF6',
                           'sEkFVE3XAIix30aWoNcj/YuEXECvnmQOjMtB23u3eTiqXdUAr1d656hgB7eFZOztZDOM',
                           'krcpwdqLf2qydJPcz0mFosBj']},
               {'id': 'q10',
                'section': '9',
                'form': 'choice',
                'text': 'A logit-comparison tool prints FAIL for your build against the '
                        "reference's saved logits, for main against them, and for that saved file "
                        'compared with itself (the same file given as both inputs; nothing is '
                        're-run). What do you conclude?',
                'options': ['Its threshold is meant for two runs of one implementation, so FAILs '
                            'across implementations are expected: ignore all three verdicts.',
                            'The tool is suspect: a file against itself must give zero divergence. '
                            'Check its threshold, parsing, normalisation, determinism.',
                            'All three are wrong, the reference included: even its own logits '
                            'fail, so its saved file must be corrupt as well.',
                            'The reference is not deterministic: its logits differ from run to '
                            'run, and the tool, with its strict bar, works as intended.'],
                'hint': 'what must any comparison say about one file compared with itself?',
                'key': ['04cd6f839710785d808dccc415637627',
                        '32d78a12fa4bb53f6d16a29cf37b787d',
                        '8c978d1752c72288f607667e7a705ee5',
                        'df893070cf2140595e2117bae6f07c06'],
                'sealed': ['8hB9vBzqlkCC8MMe5k7BJTmwkh9IjJalwSeeJPkdAkCaBq/9StbkydWmhO2AcAsQQyx8',
                           '/2PmH6XRfT1Lau1qKfJcKry5fqrOyZs83SjsLSCC5ke7B/jAaZNxv0KBMZNHgq9LKY2P',
                           'oYNN61pZtk32DJhgk8wwm9bIiObrPBxJcNrHrTScS+cULJKWKW8rAx8s60H2cDmVPKzE',
                           '0PgYF4OdOvYpJqnZjz7pDEdsr8uhZW+9Ud1F/MSingcsTVcy0H5NdMia1PJA7eb7pAEX',
                           '0i/bGPrm2EB+ir7euoYLokfAbUy7yW+fZELi47xU5lYCu2vgz3MH3wJHh5ulS3dJ+qGJ',
                           'Ov+t+QsTCivBYek/ZOrSlLs5oLekf7f1m32Ezkl4Hd5oIymXSuNSMHQO3p1vgQMZJ3x0',
                           'VM4f6f9olfnub/8qkLWP3fy+z6Vs3VkGDhWIuLqM4ppirZlcho8Ri5Ni1mXro9t7+9fN',
                           '6mO1Jx3hSVnuWAHvQuhG/d0XG+QS0W+37GKx9AN+5ZD5apMtJxHsExye86i3uwOrGlKS',
                           'I6dR24ZUpkaMEl0HmZXYIMOzpVe0HV1tjFraYEdAwKwz/VOmnip2WkmxHvUsWbf0BK/D',
                           'BI+LMXKrqvbHsmWNAErAESG6FbNr9cvlHvw82xJxigLVXP1xR3wdx4vomBgdH6p/Vitb',
                           'pk00ob5uhBzfl71OYBMxlhh36Lf0jhG0D3yThM93U3cyjdnmA8MDmMqNjoN9/ga44q+I',
                           '6A2ensr6+G2yOQFGQ+5NIVzriX/w3O6CVHnnYeQN5eqynNMJlrpS4a7XDdFn60jMXnVk',
                           'ixLVLFrxHwEMYE91HM8ZRRqEj0JQUFsOVkXkYmN0tfOOeGACDohE1Iz3jwSzNb6clRfi',
                           'mvQMhbzf5ASqTIENc6z02yir3InR+SevgeN7z+p6dj5AWdK2rbFR2IZtkeMBgTNdmTZP',
                           'QZN0ifdrW8fKN8qd3M8VWT13p680xd+461ImMDfRKUnGqQ0an4fbtjsZDd5h29ohi0qK',
                           'vfMjfjIbun+xAu7OLh0eE1Oo']}]}
