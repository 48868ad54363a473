def test_probe(tiny_repo):
    import json
    print(sorted(p.name for p in (tiny_repo / "tiny-mt" / "1").iterdir()))
    m = json.loads((tiny_repo / "tiny-mt" / "1" / "manifest.json").read_text())
    print(m["limits"], m["tokenizer"], m["graphs"]["decoder_step"])
