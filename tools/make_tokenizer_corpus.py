#!/usr/bin/env python3
"""make_tokenizer_corpus.py - writes the tokenizer exactness corpus (python3 stdlib only, seeded).

  python3 tools/make_tokenizer_corpus.py                 # tests/fixtures/tokenizer/corpus.jsonl
  python3 tools/make_tokenizer_corpus.py --bench F 10    # ~10 MB mixed benchmark corpus to F

corpus.jsonl: one JSON string per line (ASCII-escaped), >= 2,000 strings: prose in 30 scripts,
code, JSON, URLs, numbers, emoji (ZWJ, skin tones, flags, keycaps), combining marks (decomposed,
stacked, mis-ordered, composition exclusions, Hangul jamo), whitespace/CRLF runs, contractions in
every case, added tokens inside text, long repeats, random mixes of Unicode blocks.
Random code points are drawn only from characters assigned in Python's Unicode database (14.0
for 3.11), so that differences between Unicode versions of the libraries do not show up as noise.
The bench corpus is a length-prefixed file (<u32 little-endian byte length><UTF-8 bytes>)*, one
record per document, read by bench/bench_tokenizer.c and tools/bench_hf_tokenizer.py.
"""
import json
import random
import struct
import sys
import unicodedata

PROSE = {
    "en": ["The quick brown fox jumps over the lazy dog.", "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.", "I've been told he'll arrive by 5 p.m.; we'd better hurry!"],
    "fr": ["Le cœur a ses raisons que la raison ne connaît point.", "Où est la bibliothèque ? C'est à côté de l'église."],
    "de": ["Größenwahn ist keine Straße für Übermütige.", "Die Würde des Menschen ist unantastbar."],
    "es": ["¿Dónde está el baño? ¡Qué día tan bonito!", "El niño comió piñata en el año pasado."],
    "pt": ["Não há nada mais difícil do que a simplicidade.", "A pressa é inimiga da perfeição."],
    "it": ["Nel mezzo del cammin di nostra vita mi ritrovai per una selva oscura.", "Perché l'è così?"],
    "pl": ["Zażółć gęślą jaźń.", "Pchnąć w tę łódź jeża lub ośm skrzyń fig."],
    "tr": ["Pijamalı hasta yağız şoföre çabucak güvendi.", "İstanbul'da ılık bir gün."],
    "vi": ["Tiếng Việt có dấu rất đẹp.", "Cửa Việt là một cửa biển ở Quảng Trị."],
    "ru": ["Съешь же ещё этих мягких французских булок, да выпей чаю.", "Москва — столица России."],
    "uk": ["Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!"],
    "el": ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "Η γλώσσα μου έδωσαν ελληνική."],
    "ar": ["نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.", "مرحبا بالعالم!"],
    "he": ["דג סקרן שט בים מאוכזב ולפתע מצא חברה.", "שָׁלוֹם עֲלֵיכֶם"],
    "fa": ["به نام خداوند جان و خرد کزین برتر اندیشه برنگذرد."],
    "hi": ["ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।", "नमस्ते दुनिया"],
    "bn": ["আমি বাংলায় গান গাই।", "সকলের জন্য শিক্ষা।"],
    "ta": ["யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்."],
    "te": ["తెలుగు భాష చాలా అందమైనది."],
    "th": ["เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน"],
    "km": ["កាន់តែពិសេសអាចខលចេញ", "ភាសាខ្មែរ"],
    "ka": ["ქართული ენა ძალიან ლამაზია."],
    "hy": ["Բարև աշխարհ, ինչպե՞ս ես:"],
    "am": ["ሰላም ለዓለም። እንዴት ነህ?"],
    "zh": ["我想在apple工作1314151天～", "天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。", "這是繁體中文的句子，包含標點符號。"],
    "ja": ["いろはにほへと ちりぬるを わかよたれそ つねならむ", "東京タワーは日本の観光名所です。ｶﾀｶﾅ"],
    "ko": ["다람쥐 헌 쳇바퀴에 타고파.", "안녕하세요, 세계!"],
    "my": ["မင်္ဂလာပါ ကမ္ဘာလောက"],
    "si": ["ආයුබෝවන් ලෝකය"],
    "lo": ["ສະບາຍດີ ໂລກ"],
    "bo": ["བཀྲ་ཤིས་བདེ་ལེགས།"],
    "mn": ["ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ", "Монгол хэл"],
    "yi": ["װאָס מאַכסטו?"],
}

CODE = [
    "int main(int argc, char **argv) {\n    printf(\"hello, %s\\n\", argv[0]);\n    return 0;\n}\n",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)\n",
    "const xs = [1, 2, 3].map((x) => x ** 2).filter(x => x !== 4); // ok\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\r\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Test</title></head>\n<body><p class='x'>Hi &amp; bye</p></body></html>",
    "#!/bin/bash\nfor f in *.txt; do\n  echo \"$f\" | sed -e 's/a/b/g' >> out.log 2>&1\ndone\n",
    "    if (x->next != NULL && x->next->val == 0x7fffffff) { x = x->next; }\n",
    "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
    "@@ -1,4 +1,5 @@\n-old line\n+new line\n+another\n context\n",
    "```python\nimport numpy as np\nprint(np.zeros((3, 4)).shape)\n```",
    "template <typename T> struct Foo { std::vector<T> xs; auto size() const -> size_t { return xs.size(); } };",
    "    \t  mixed   indentation\t\t here  \n\n\n   ",
]

EMOJI = ["😀", "🦙", "🚀", "👍🏽", "👍🏿", "👋🏻", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "🇯🇵", "🇺🇸", "🇩🇪", "1️⃣", "#️⃣", "❤️", "❤", "😶‍🌫️",
         "🧑🏾‍🤝‍🧑🏻", "🫠", "🥲", "✅", "☕", "🐈‍⬛", "👁️‍🗨️", "🤷‍♀️", "🙆🏼‍♂️", "©️", "™", "🔥🔥🔥"]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>", "<|vision_start|>",
            "<|image_pad|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
            "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|repo_name|>", "<|file_sep|>"]

COMBINING = [
    "e\u0301", "re\u0301sume\u0301", "a\u0300" * 5, "A\u030a", "\u212b", "\u2126", "\u00c5", "o\u0308\u0304", "o\u0304\u0308",
    "a\u0323\u0302", "a\u0302\u0323", "q\u0307\u0323", "s\u0323\u0307", "\u1e0b\u0323", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034d",
    "\u0958", "\u0915\u093c", "\u09dc", "\u0b5c", "\uf900", "\uf9d0", "\u1100\u1161", "\u1100\u1161\u11a8", "\u110b\u1175\u11af",
    "\u0301", "\u0301abc", " \u0301", "1\u0301", "!\u0301", "\u3099", "\u304b\u3099", "\u30cf\u309a", "\u0627\u0653", "\u0648\u0654",
    "T\u1ef5\u0301", "Vie\u0323\u0302t", "\u00e9\u0301", "\u0345\u0313", "\u03b1\u0313\u0301\u0345", "\u1f00\u0345", "\u05e9\u05c1\u05b8",
    "\u0dd9\u0dcf", "\u0dd9\u0dca", "\u0b47\u0b3e", "\u0bc6\u0bbe", "\u1025\u102e", "\u0e40\u0e01\u0e48\u0e32", "\u0fb2\u0f80", "\u0f71\u0f72",
    "n\u0303o", "\u0049\u0307", "\u0130", "\u00df", "\u1e9e", "\ufb01", "\u2160\u2161", "\u2460", "\u00bd", "\u0665\u0666",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "\r\n\r\n", " \n", "\n ", "\t\n", " \r\n ", "\u00a0", "\u3000",
              "\u2028", "\u2029", "\u0085", "\u180e", "\u200b", "\u2009", "\u202f", "\u205f", "\u000b", "\u000c", "\u1680", "\ufeff"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]

# Blocks for random mixes (ranges of code points; unassigned ones are filtered out).
BLOCKS = [(0x20, 0x7e), (0xa0, 0xff), (0x100, 0x24f), (0x250, 0x2af), (0x2b0, 0x2ff), (0x300, 0x36f), (0x370, 0x3ff),
          (0x400, 0x4ff), (0x530, 0x58f), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0x980, 0x9ff), (0xe00, 0xe7f),
          (0x10a0, 0x10ff), (0x1100, 0x11ff), (0x1e00, 0x1eff), (0x1f00, 0x1fff), (0x2000, 0x206f), (0x20a0, 0x20bf),
          (0x2100, 0x214f), (0x2150, 0x218f), (0x2190, 0x21ff), (0x2200, 0x22ff), (0x2500, 0x257f), (0x2700, 0x27bf),
          (0x3000, 0x303f), (0x3040, 0x309f), (0x30a0, 0x30ff), (0x4e00, 0x9fa5), (0xac00, 0xd7a3), (0xe000, 0xe0ff),
          (0xfb00, 0xfb4f), (0xfe20, 0xfe2f), (0xff00, 0xffef), (0x1d400, 0x1d7ff), (0x1f300, 0x1f5ff), (0x1f600, 0x1f64f),
          (0x1f900, 0x1f9ff), (0x20000, 0x2a6d6), (0x1, 0x1f), (0x80, 0x9f)]


def assigned(cp):
    c = chr(cp)
    cat = unicodedata.category(c)
    return cat not in ("Cn", "Cs")


def rand_block_text(rng, n):
    out = []
    blocks = rng.sample(BLOCKS, rng.randint(1, 5))
    while len(out) < n:
        lo, hi = rng.choice(blocks)
        cp = rng.randint(lo, hi)
        if assigned(cp) and cp != 0x1e:
            out.append(chr(cp))
    return "".join(out)


def rand_case(rng, s):
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in s)


def rand_json(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        k = rng.randint(0, 5)
        return [None, True, False, rng.randint(-10**6, 10**9), round(rng.uniform(-1e3, 1e3), rng.randint(0, 6)),
                rng.choice(sum(PROSE.values(), []))[: rng.randint(0, 30)]][k]
    if r < 0.65:
        return [rand_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["id", "name", "value", "ключ", "名前", "x_y", "Type", "tool_calls", "arguments"]) + str(i): rand_json(rng, depth + 1)
            for i in range(rng.randint(0, 4))}


def rand_url(rng):
    host = rng.choice(["example.com", "www.wikipedia.org", "пример.рф", "例子.测试", "api.github.com", "localhost:8080", "192.168.0.1"])
    path = "/".join(rng.choice(["wiki", "Käse", "v1", "repos", "a%20b", "search", "index.html", "~user", "日本"]) for _ in range(rng.randint(0, 4)))
    q = "&".join(f"{rng.choice(['q', 'page', 'utm_source', 'x'])}={rng.randint(0, 99999)}" for _ in range(rng.randint(0, 3)))
    return f"{rng.choice(['http', 'https', 'ftp'])}://{host}/{path}" + (f"?{q}" if q else "") + rng.choice(["", "#frag", "#section-2.1"])


def rand_number(rng):
    k = rng.randint(0, 9)
    if k == 0: return str(rng.randint(0, 10**rng.randint(1, 30)))
    if k == 1: return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if k == 2: return f"{rng.randint(1, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}"
    if k == 3: return f"{rng.uniform(0, 10):.3e}"
    if k == 4: return f"+1 ({rng.randint(200, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if k == 5: return f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    if k == 6: return "".join(chr(0x660 + int(d)) for d in str(rng.randint(0, 10**8)))
    if k == 7: return "".join(chr(0xff10 + int(d)) for d in str(rng.randint(0, 10**8)))
    if k == 8: return rng.choice(["Ⅻ", "ⅻ", "½", "¾", "²³", "①②③", "٣.١٤", "१२३", "๑๒๓", "0x1F", "1e-9", "3.14159265358979"])
    return f"{rng.randint(0, 100)}%"


def make_corpus(seed=1234):
    rng = random.Random(seed)
    out = []
    sentences = [s for v in PROSE.values() for s in v]
    # 1. prose: each sentence, and random mixes
    out += sentences
    for _ in range(400):
        ss = rng.sample(sentences, rng.randint(1, 4))
        sep = rng.choice([" ", "\n", "\n\n", "  ", "\r\n", "\t", ""])
        out.append(sep.join(ss))
    # 2. code
    out += CODE
    for _ in range(120):
        out.append("".join(rng.sample(CODE, rng.randint(1, 3))))
    # 3. JSON
    for _ in range(150):
        v = rand_json(rng)
        out.append(json.dumps(v, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2, "\t"])))
    # 4. URLs
    for _ in range(100):
        out.append(rng.choice(["", "see ", "Link: ", "(", "<"]) + rand_url(rng) + rng.choice(["", ".", ")", ">", " ok"]))
    # 5. numbers
    for _ in range(150):
        out.append(" ".join(rand_number(rng) for _ in range(rng.randint(1, 5))))
    # 6. emoji
    out += EMOJI
    for _ in range(120):
        parts = [rng.choice(EMOJI) for _ in range(rng.randint(1, 6))]
        out.append(rng.choice(["", " ", "hi "]).join(parts) + rng.choice(["", "!", " ok", "\n"]))
    # 7. combining marks
    out += COMBINING
    for _ in range(150):
        parts = [rng.choice(COMBINING + sentences[:5] + [" ", "x", "Ab"]) for _ in range(rng.randint(1, 5))]
        out.append("".join(parts))
    # 8. whitespace and CRLF runs
    out += WHITESPACE
    for _ in range(150):
        parts = [rng.choice(WHITESPACE) * rng.randint(1, 6) if rng.random() < 0.6 else rng.choice(["a", "word", "1", "!", "é", "中", "\u0301"])
                 for _ in range(rng.randint(1, 10))]
        out.append("".join(parts))
    # 9. contractions in all cases
    for c in CONTRACTIONS:
        for variant in sorted({c, c.upper(), c.capitalize(), c.lower()}):
            out.append(f"they{variant} here")
    for _ in range(120):
        word = rng.choice(["it", "we", "THEY", "you", "I", "she", "Ö", "ab1", "", " "])
        c = rand_case(rng, rng.choice(CONTRACTIONS))
        out.append(word + c + rng.choice(["", " ", "x", "s", "\n", "'", "ſ"]) + rng.choice(["", " end"]))
    out += ["'ſ", "it'ſ", "'K", "'Ｓ", "''s", "'s's", "'", "'''", "don't", "DON'T", "y'all", "rock'n'roll"]
    # 10. added tokens inside text
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.5:
                parts.append(rng.choice(SPECIALS))
            else:
                parts.append(rng.choice(sentences + ["\n", " ", "user\n", "assistant\n", "<|im_start", "im_end|>", "<|", "|>", "<think"])[:60])
        out.append("".join(parts))
    out += ["<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!<|im_end|>",
            "<<|im_end|>>", "<|im_end|><|im_end|>", " <|endoftext|> ", "<|endoftext|", "<think></think>", "<tool_call>\n{\"a\": 1}\n</tool_call>"]
    # 11. long repeats
    for unit in ["a", "ab", " ", "\n", "\r\n", "🙂", "的", "=-", "0", "aaa ", "Hello ", "\t ", "é", "e\u0301", "ー", "!!", "<|im_end|>", "ل", "😶‍🌫️", "x\u0301\u0302"]:
        n = rng.randint(200, 3000)
        out.append(unit * (n // max(1, len(unit))))
    out.append("a" * 20000)
    out.append(" " * 10000 + "x")
    # 12. random mixes of Unicode blocks
    for _ in range(350):
        out.append(rand_block_text(rng, rng.randint(1, 60)))
    # 13. odd corners
    out += ["", "\u0000", "a\u0000b", "\x7f", "\ufeffBOM", "\uffff", "\U0010fffd", "\U0001f600" * 3, "a" * 257,
            "x" + "\u0301" * 40, "ｆｕｌｌｗｉｄｔｈ", "ǅungla", "ＡＢＣ１２３", "1,000,000.00", "$100 €200 ¥300 £400 ₹500"]
    # 14. mixed script runs without spaces and random case
    for _ in range(100):
        ss = [rng.choice(sentences)[: rng.randint(1, 20)] for _ in range(rng.randint(2, 5))]
        s = "".join(ss)
        out.append(rand_case(rng, s) if rng.random() < 0.3 else s)
    return out


def make_bench(path, mb, seed=99):
    rng = random.Random(seed)
    corpus = [s for s in make_corpus() if len(s) < 5000]
    sentences = [s for v in PROSE.values() for s in v]
    target = int(mb * 1e6)
    total = 0
    with open(path, "wb") as f:
        while total < target:
            # a document: mostly prose paragraphs (English-heavy, like real prompts), some code, JSON, and corpus strings
            parts = []
            for _ in range(rng.randint(5, 40)):
                r = rng.random()
                if r < 0.45:
                    parts.append(" ".join(rng.choice(PROSE["en"]) for _ in range(rng.randint(1, 6))))
                elif r < 0.65:
                    parts.append(" ".join(rng.choice(sentences) for _ in range(rng.randint(1, 4))))
                elif r < 0.8:
                    parts.append(rng.choice(CODE))
                elif r < 0.9:
                    parts.append(json.dumps(rand_json(rng), ensure_ascii=False, indent=2))
                else:
                    parts.append(rng.choice(corpus))
            doc = "\n\n".join(parts).encode("utf-8")
            f.write(struct.pack("<I", len(doc)))
            f.write(doc)
            total += len(doc)
    print(f"{path}: {total / 1e6:.1f} MB")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--bench":
        make_bench(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 10.0)
        return
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer/corpus.jsonl"
    corpus = make_corpus()
    with open(path, "w", encoding="ascii") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"{path}: {len(corpus)} strings, {sum(len(s.encode('utf-8')) for s in corpus)} bytes of UTF-8")


if __name__ == "__main__":
    main()
