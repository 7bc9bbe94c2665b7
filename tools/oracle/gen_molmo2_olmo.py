"""Tiny random-weight Molmo2 with the OLMo decoder variant and its goldens: tests/fixtures/molmo2_olmo.

The Molmo2 fixture (gen_molmo2.py) with the text config of the OLMo-based checkpoints (Molmo2-O): the q and k
RMSNorms over the whole projection before it is split into heads (`qk_norm_type="olmo"`, weights of
heads * head_dim) and the norms on each block's output instead of before it (`norm_after=True`). Its four
standard variants."""

import common
import gen_molmo2


def main() -> None:
    args = common.parse_args(__doc__)
    gen_molmo2.build("molmo2_olmo", "gen_molmo2_olmo.py", {"qk_norm_type": "olmo", "norm_after": True},
                     check=args.check, extra_variants=False)


if __name__ == "__main__":
    main()
