#!/usr/bin/env python3
"""Tokenizer stress corpus and HF transformers' reference ids for it (no torch, no network).

The tokenizer lean builds from a GGUF's metadata must give the same ids as tokenizer.json does
through transformers. This script writes, under rust/lean-tokenizer/tests/data/:
  * corpus.json: a JSON array of several hundred strings: hand-written strings that stress
    tokenizers (scripts and languages, emoji sequences, NFC vs NFD, code, whitespace runs, CRLF and
    lone CR, numbers, contractions, special-token text, long repeats, control and unusual code
    points, Markdown/JSON/URLs/HTML) plus seeded random mixes of those pieces. Invisible and
    unusual characters are written as \\u escapes so the file stays readable; it is still plain JSON.
  * corpus-ids.json: {"<model dir>": {"ids": [[...]], "ids_with_special": [[...]],
    "roundtrip": [bool]}} with ids[i] = tok(corpus[i], add_special_tokens=False)["input_ids"],
    ids_with_special the same with add_special_tokens=True and
    roundtrip[i] = (tok.decode(ids[i]) == corpus[i]), tok = AutoTokenizer.from_pretrained(dir).
    One model a line.
  * corpus-chats.json: {"<model dir>": [{"messages", "add_generation_prompt", "rendered", "ids"}]}
    with rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
    and ids = tok(rendered, add_special_tokens=False)["input_ids"]; message contents are corpus
    strings.

Everything is deterministic (fixed seeds, no set iteration order).

usage: ~/.cache/lean/venv/bin/python scripts/gen_tokenizer_corpus.py [MODELS_DIR]
       (MODELS_DIR defaults to $LEAN_MODELS, else ~/.cache/lean/models)
"""
import json
import os
import random
import sys
import unicodedata

from transformers import AutoTokenizer

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]

SEED = 20240611
TARGET_COUNT = 590  # hand-written strings first, then seeded random mixes up to this many

# ---------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------

LANGUAGES = [
    # Latin with diacritics
    "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôpital ? Ça va, garçon !",
    "Größe, Fußgängerübergänge und Äpfel: Österreich ist schön. STRASSE vs. Straße",
    "¿Dónde está el niño? ¡Qué año más extraño! Pingüino, cigüeña, añejo.",
    "Ação, coração, pão e feijão — não é? Olá, avó e avô.",
    "Zażółć gęślą jaźń. Łódź, Kraków, Gdańsk, Wrocław.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Tiếng Việt có nhiều dấu: Nguyễn, Phượng, người, được, những, chuyện.",
    "Þetta er íslenska: ðað, þú, æðislegt, Ísafjörður.",
    "Türkçe: İstanbul, ılık, şeker, çiğ, ğ, ö, ü; I ı İ i",
    "Română: ș ț (comma below) vs ş ţ (cedilla), Timișoara, București.",
    "Ångström, Malmö, Øresund, Ærø, Lærdal, smørrebrød.",
    "Eesti keel: jõgi, õun, ülikool; Suomi: Hyvää päivää, älä hätäile.",
    # Cyrillic
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Україна: їжак, ґанок, є, Київ, Львів. Беларусь: ў. Српски: ђ ћ џ љ њ.",
    "ПРИВЕТ, МИР! Привет, мир! привет мир",
    # Greek
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Αθήνα, Θεσσαλονίκη; ΑΒΓΔΕ αβγδε ς σ",
    "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν.",
    # Arabic, Hebrew (RTL), Persian, Urdu
    "العربية: مرحبا بالعالم! كيف حالك؟ ١٢٣٤٥٦٧٨٩٠",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ",
    "עברית: שלום עולם! מה שלומך? בְּרֵאשִׁית בָּרָא",
    "فارسی: سلام دنیا، حال شما چطور است؟ ۱۲۳۴۵",
    "اردو: یہ ایک جملہ ہے۔",
    "mixed RTL: the word שלום means peace and مرحبا means hello",
    # Indic
    "हिन्दी: नमस्ते दुनिया! क्या हाल है? क्षत्रिय, ज्ञान, श्री। १२३४५",
    "বাংলা: আমি বাংলায় গান গাই।",
    "தமிழ்: வணக்கம் உலகம்",
    "తెలుగు: నమస్కారం; ಕನ್ನಡ: ನಮಸ್ಕಾರ; മലയാളം: നമസ്കാരം",
    "ਪੰਜਾਬੀ: ਸਤ ਸ੍ਰੀ ਅਕਾਲ; ગુજરાતી: નમસ્તે",
    # Southeast Asian
    "ภาษาไทย: สวัสดีครับ ยินดีที่ได้รู้จัก กรุงเทพมหานคร ๑๒๓",
    "ລາວ: ສະບາຍດີ; ខ្មែរ: សួស្តី; မြန်မာ: မင်္ဂလာပါ",
    # CJK
    "中文：我爱自然语言处理。今天天气很好，我们去公园散步吧！",
    "繁體中文：臺灣、香港、電腦、軟體、資訊。",
    "日本語：吾輩は猫である。名前はまだ無い。",
    "ひらがなだけのぶんしょうです。カタカナダケノブンショウデス。ｶﾀｶﾅ ﾊﾝｶｸ",
    "한국어: 안녕하세요, 세계! 대한민국 서울특별시 강남구",
    "漢字かな交じり文とＡＳＣＩＩ混在：Unicode正規化のテスト１２３",
    "CJK Ext B: 𠀀𠀁𠀂 𪚥 𩸽 and compatibility: 豈 更 車 (U+F900..)",
    # others
    "Հայերեն: Բարեւ աշխարհ; ქართული: გამარჯობა; አማርኛ: ሰላም ልዑል",
    "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ; ᏣᎳᎩ; ᐃᓄᒃᑎᑐᑦ; ꦧꦱꦗꦮ",
    "Runes ᚠᚢᚦᚨᚱᚲ, Gothic 𐌰𐌱𐌲, Linear B 𐀀𐀁, Cuneiform 𒀀𒀁",
]

EMOJI = [
    "😀",
    "😀😃😄😁😆😅🤣😂",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿",
    "👋🏽 hello 🙋🏿‍♀️ hi",
    "👨‍👩‍👧‍👦",
    "👨‍👩‍👧‍👦👩‍👩‍👦‍👦👨‍👨‍👧",
    "family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍💋‍👨 technologist: 👩🏾‍💻",
    "🏳️‍🌈 🏴‍☠️ 🏳️‍⚧️",
    "🇫🇷🇯🇵🇺🇸🇩🇪🇬🇧🇨🇳🇰🇷🇧🇷🇮🇳",
    "🇦",  # lone regional indicator
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏴󠁧󠁢󠁷󠁬󠁳󠁿",  # tag sequences
    "keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣ 🔟",
    "1\u20e3 #\u20e3",  # keycap without VS16
    "❤️ vs ❤ vs ❤︎, ☺️ vs ☺, ✔️ ✔",
    "text\ufe0e emoji\ufe0f ↔\ufe0f",
    "©️®️™️ ℹ️ Ⓜ️",
    "🧑‍🤝‍🧑 🧑🏻‍🤝‍🧑🏿 👩🏽‍🦰 🧔🏾‍♂️ 🏃‍➡️",
    "🫠🫡🫥🪿🫎🪼 (newer emoji)",
    ":-) :D ;) <3 ¯\\_(ツ)_/¯ (╯°□°)╯︵ ┻━┻",
]

NORMALIZATION = [
    # (precomposed, decomposed) pairs are both added; NFC maps the second onto the first
    ("é", "e\u0301"),
    ("café", "cafe\u0301"),
    ("naïve résumé", "nai\u0308ve re\u0301sume\u0301"),
    ("Ångström", "A\u030angstro\u0308m"),
    ("Ñandú", "N\u0303andu\u0301"),
    ("Ệ ệ ǖ ǘ", "E\u0323\u0302 e\u0323\u0302 u\u0308\u0304 u\u0308\u0301"),
    ("Nguyễn Phượng", "Nguye\u0302\u0303n Phu\u031bo\u031b\u0323ng"),
    ("한국어", "\u1112\u1161\u11ab\u1100\u116e\u11a8\u110b\u1165"),  # Hangul jamo
    ("ガギグ", "\u30ab\u3099\u30ad\u3099\u30af\u3099"),  # katakana + combining voiced mark
    ("ώ ΐ", "\u03c9\u0301 \u03b9\u0308\u0301"),
]

NFC_SPECIALS = [
    "Angstrom sign \u212b vs \u00c5 vs A\u030a",
    "Ohm sign \u2126 vs Omega \u03a9; Kelvin \u212a vs K",
    "Greek question mark \u037e vs semicolon ;",
    "ano teleia \u0387 vs middle dot \u00b7",
    "CJK compatibility \uf900\uf901\uf902 \ufa10 \U0002f800",
    "reorder: a\u0301\u0323 vs a\u0323\u0301 vs \u1ea1\u0301",
    "q\u0307\u0323 q\u0323\u0307 ḍ\u0307 d\u0323\u0307 d\u0307\u0323",
    "exclusions: \u0958 \u0915\u093c \u2adc \u2add\u0338",
    "Zalgo: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f"
    "a\u0360\u0344\u0342\u0300l\u0309\u0366g\u0346o\u0352\u0308\u0305",
    "combining on space: \u0301 \u0308x \u0303",
    "\u0301",
    "e\u0301\u0301\u0301\u0301\u0301",
    "NFKC-only (NFC keeps): ﬁ ﬂ ｆｕｌｌ ① ² ½ ™ ㍿ ℌ ℍ",
    "Hebrew points: \u05e9\u05c1\u05bc \u05e9\u05bc\u05c1 \ufb2c",
    "Arabic: \u0627\u0653 \u0622 \u0648\u0654 \u0624",
    "Thai sara am: \u0e33 \u0e4d\u0e32; Tibetan: \u0f73 \u0f71\u0f72",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo:\n\tdef __init__(self, x):\n\t\tself.x = x  # tab indented\n\n\tdef __repr__(self):\n\t\treturn f\"Foo({self.x!r})\"\n",
    "import numpy as np\n\nx = np.arange(10, dtype=np.float32)\nprint(x @ x.T, x[..., None].shape)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n",
    "impl<'a, T: Clone + 'a> Iterator for Iter<'a, T> {\n    type Item = &'a T;\n    fn next(&mut self) -> Option<Self::Item> { self.inner.next() }\n}",
    "#[derive(Debug, Clone, Copy, PartialEq, Eq)]\npub enum Kind { A = 0x01, B = 0b10, C = 0o7 }",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`); // 3\nlet x = a ?? b ?. c;",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, 世界\")\n}\n",
    "SELECT u.id, COUNT(*) AS n\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\nWHERE u.age >= 18\nGROUP BY u.id\nHAVING n > 2;",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | sed -e 's/a/b/g' >> out.log 2>&1\ndone\n",
    "all: build\n\nbuild:\n\t$(CC) -O2 -o $@ $^ $(LDFLAGS)\n\n.PHONY: all build\n",
    "main :: IO ()\nmain = mapM_ print $ take 10 $ filter even [1..]\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
    "key: value\nlist:\n  - one\n  - two\nnested:\n    deep: [1, 2, 3]\n    str: \"quoted # not a comment\"\n",
    "--- a/file.rs\n+++ b/file.rs\n@@ -1,3 +1,4 @@\n fn a() {}\n-fn b() {}\n+fn b() -> u32 { 0 }\n+\n",
    "x <<= 2; y >>>= 3; z **= 4; a !== b; c === d; e => f; g -> h; i :: j; k ... l",
    "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[A-Z]{2,})$ and \\d+\\.\\d*",
    "    \n\t\n    indented after blank lines\n\t\ttabs\n  \t  mixed\n",
    "\t\tif (x) {\n\t\t\treturn;\n\t\t}\n",
    "        deeply\n            nested\n                code\n",
]

MARKUP = [
    "# Title\n\n## Subtitle\n\n- item one\n- item **two**\n  - nested _item_\n1. first\n2. second\n\n> quote\n",
    "```python\nprint('hi')\n```\n\nInline `code` and [a link](https://example.com) and ![img](a.png)",
    "| a | b |\n|---|:-:|\n| 1 | 2 |\n| 3 | 4 |\n",
    "***bold italic*** ~~strike~~ <kbd>Ctrl</kbd>+<kbd>C</kbd> --- ___ ***",
    "{\"key\": [1, 2, {\"nested\": null}], \"flag\": true, \"num\": -1.5e+10, \"s\": \"a\\\"b\\\\c\\u00e9\"}",
    "{\n  \"name\": \"lean\",\n  \"version\": \"0.1.0\",\n  \"deps\": {}\n}",
    "https://example.com/path/to/resource?query=value&other=123#fragment",
    "http://user:pass@sub.domain.co.uk:8080/a%20b/c?x=1&y=%E2%9C%93",
    "https://ja.wikipedia.org/wiki/日本語 and https://xn--n3h.com",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>T</title></head>\n<body>\n  <p class=\"x\">Hello &amp; goodbye &lt;3 &#x1F600; &nbsp;</p>\n</body>\n</html>",
    "<div style=\"color:red\" data-x='1'><br/><img src=x onerror=alert(1)></div>",
    "C:\\Users\\Name\\Documents\\file.txt and /usr/local/bin/python3 and ~/.config/",
    "email: someone.special+tag@example.org, phone: +1 (555) 123-4567",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
]

NUMBERS_HAND = [
    "0", "42", "007 -1 3.14159", "1e-9", "0xDEADBEEF", "1,000,000",
    "+1 -0.0 .5 5. 1E+10 6.022e23 2.5e-3",
    "0x0 0XFF 0b1010_1010 0o755 1_000_000 0x1F600 #ff00aa",
    "1.000.000,00 1 000 000 12'345'678 3/4 50% $1,234.56 €99,99 ¥1000 £5",
    "2024-06-11 12:34:56.789 v1.2.3-rc.1 192.168.0.1 ::1 fe80::1ff:fe23:4567:890a",
    "+44 20 7946 0958, 4111-1111-1111-1111, ISBN 978-3-16-148410-0",
    "3.141592653589793238462643383279",
    "-9223372036854775808 18446744073709551615 1.7976931348623157e308 NaN Infinity -inf",
    "1st 2nd 3rd 4th 11th 21st 100th x1 x12 x123 a1b2c3 123abc abc123",
    "12.34.56 1..10 1...2 10:30am 10:30 PM",
    "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "¹²³ ⁴⁵ ₆₇ ½ ¼ ¾ ⅓ ⅞", "Ⅰ Ⅱ Ⅲ Ⅻ ⅻ ① ② ⑩ ⑳",
    "〇一二三四五六七八九十百千万亿", "๑๒๓ 𝟎𝟏𝟐𝟑 𝟘𝟙𝟚",
]

CONTRACTIONS = [
    "I'm sure it's what they've said: we'll see, you'd know",
    "I'M SURE IT'S WHAT THEY'VE SAID: WE'LL SEE, YOU'D KNOW",
    "I'm It'S iT's THEY'Re they'rE We'Ll you'D",
    "don't can't won't shouldn't isn't ain't y'all'd've",
    "DON'T CAN'T WON'T SHOULDN'T ISN'T AIN'T Y'ALL'D'VE",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "I’m it’s they’ve we’ll you’d don’t THEY’RE",
    "‘quoted’ “double” „German“ «French» ‹single› 「Japanese」 『double』",
    "'tis 'twas rock'n'roll o'clock O'Neil d'Artagnan l'homme",
    "the dog's bone, the dogs' bones, James's car, 90's, 5's, 'em",
    "''s '''t \"'re\" `'ve`",
    "it' s not ' s or 's' or ' 's",
    "ľ'd Ü's 中's 😀's 1's",
]

PUNCT = [
    "!!!", "...", "…", "—", "---", "```", "\"\"\"", "?!?!", "->", "=>",
    "??? ;;; ::: ,,, ((( ))) [[[]]] {{{}}} <<<>>> /// \\\\\\ ||| &&& ^^^ %%% $$$ ### @@@ ==== +-*/ != <=> :=",
    "--___***~~~'''\u2013-",
    "punctuation!!! ??? ... --- ___ *** ~~~ ``` ''' and then some.",
    "Hello,world!How:are;you?Fine.", "a.b.c.d e,f,g h;i;j",
    " .", " ..", " ,", ". ", " . ", "!\n", "?\r\n", ".\n\n", ":\t", ")\n\n\n",
    "。，、！？：；（）【】《》「」", "¡¿«»‹›‽⁇⁈⁉", "§¶†‡•·°±×÷∞≈≠≤≥√∑∏∫∂∇",
    "→←↑↓↔⇒⇐⇔ ∀∃∈∉∧∨¬ ⊂⊃∩∪ ℕℤℚℝℂ", "─│┌┐└┘├┤┬┴┼ ═║╔╗╚╝ ░▒▓█",
]

SPECIAL_TEXT = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_sep|>", "<|vision_start|>",
    "<repo_name>", "<file_sep>", "<jupyter_code>",
]

TOOL_CALL_TEXT = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

SPECIAL_COMBOS = [
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <|im_end|>at the end",
    "<|im_start|><|im_start|><|im_end|><|im_end|>",
    " <|im_start|>", "<|im_start|> ", "  <|im_end|>  ", "\n<|im_end|>\n",
    "x<|im_start|>y", "hello<|endoftext|>world", "1<|im_end|>2", "😀<|im_end|>😀", "é<|im_end|>é",
    "<|im_sta", "<|im_start", "|im_start|>", "<|im_start |> < |im_end| >", "<|IM_START|>",
    "<<|im_start|>>", "<|<|im_end|>|>", "<|im_end|", "<|> <||>",
    "almost special <|im_start and im_end|> and <|endoftext",
    TOOL_CALL_TEXT,
    " <tool_call> ", "x<tool_call>y</tool_call>z", "<tool_cal",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    "<|fim_prefix|><|fim_suffix|><|fim_middle|>", "<|fim_prefix",
    "<repo_name>lean<file_sep>src/main.rs\nfn main() {}", "<jupyter_code>print(1)<jupyter_output>1",
    "<reponame> <filename>a.py <gh_stars>100 <issue_start>bug<issue_comment>fixed<issue_closed>",
    "<s></s><unk><pad><mask>[CLS][SEP][PAD][UNK]<|user|><|assistant|><|system|>",
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
]

UNUSUAL = [
    # alone
    "\ufeff", "\u200b", "\u00a0", "\u200d", "\ufffd", "\ue000", "\U0010ffff", "\u2028", "\u0085",
    "\x00\x00\x00",
    # in context
    "\ufeffBOM at start, BOM\ufeffinside", "zero\u200bwidth\u200bspace", "non\u00a0breaking\u00a0space",
    " \u00a0 \u00a0\u00a0", "ZWNJ\u200cZWJ\u200d", "\u2060word\u2060joiner \u00ad soft\u00adhyphen",
    "replacement \ufffd char, private \ue000\ue001\uf8ff use \U000f0000 \U0010fffd",
    "max \U0010ffff end \ufffe\uffff noncharacters \ufdd0", "line\u2028separator para\u2029separator",
    "next\u0085line vertical\u000btab form\u000cfeed", "\x1c\x1d\x1e\x1f unit\x1fsep",
    "ideographic\u3000space\u3000\u3000", "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a",
    "em\u2003thin\u2009hair\u200anarrow\u202fmedium\u205f", "\u1680ogham\u1680space \u180emongolian\u180evs",
    "\u202aLRE\u202c \u202bRLE\u202c \u202dLRO\u202c \u202eRLO\u202c \u2066LRI\u2069 \u200eLRM \u200fRLM",
    "\U0001d400\U0001d401 \U0001d7d8 \U0001f100 \U000e0001\U000e0041 tags",
    "planes 4 and 8 (lead bytes F1, F2): \U00040000\U00080000 \U0004ffff", "a\x04b\x1dc\x13d",
    "a\x00b", "del\x7fete", "\x1b[31mred\x1b[0m bell\x07 back\x08space", "\x80\x81\x9f C1 controls",
]


def single_chars() -> list:
    chars = [chr(c) for c in range(0x00, 0x20)] + ["\x7f"]
    chars += list("!'.0Aa")
    chars += ["é", "я", "中", "’", "😀", "𠀀"]
    return chars


def whitespace_runs() -> list:
    out = []
    for n in range(1, 21):
        out.append(" " * n)
        out.append("\t" * n)
        out.append("\n" * n)
        out.append((" \t\n" * n)[:n])
    for n in (1, 2, 8, 20):
        out.append(("\n \t\r\n" * n)[:n])
        out.append("\r\n" * n)
        out.append("\r" * n)
    for n in (1, 5, 17):
        out.append("a" + " " * n + "b")
        out.append("a" + "\t" * n + "b")
        out.append("a" + "\n" * n + "b")
        out.append("word" + " " * n)
        out.append(" " * n + "word")
        out.append("x" + " " * n + "\n" + " " * n + "y")
    out += [
        "windows\r\nline\r\nendings\r\n", "old mac\rline\rendings\r", "mixed\r\n\n\r\r\n endings",
        "a\r\n\r\nb", "\n\r", "\r\r\n \r\n \t\r\n\t",
        " \t \n mixed \n\t whitespace \t\n", "multiple   spaces    between     words",
        "line one\nline two\n\nline four\n", "  \n  \n  \t \t \t",
        "space before newline \n next", "  two\n   three\n    four",
    ]
    return out


def numbers() -> list:
    out = list(NUMBERS_HAND)
    rng = random.Random(SEED + 1)
    base = "1234567890"
    for n in range(1, 31):
        out.append((base * 3)[:n])

    def digits(n: int) -> str:
        return "".join(rng.choice("0123456789") for _ in range(n))

    for n in (3, 16, 30):
        out.append("x" + digits(n) + "y")
        out.append(digits(n) + "." + digits(rng.randint(1, 9)))
    for n in (4, 10):
        out.append(f"{int(digits(n)):,}")
    out.append("price: 12.99, qty: 3, total = 38.97 (tax 8.25%)")
    out.append("The year 2024 had 366 days; 1,234 people and 56.7% agreed.")
    return out


def long_repeats() -> list:
    return [
        "a" * 1000,
        "ab" * 500,
        " " * 300,
        "\n" * 200,
        "\t" * 100,
        "😀" * 100,
        "0123456789" * 20,
        "!" * 200,
        "中" * 150,
        "Pneumonoultramicroscopicsilicovolcanoconiosis" * 4,
        "é" * 100 + "e\u0301" * 100,
        "  \n" * 60,
    ]


def build_hand_written() -> list:
    out = ["", " "]
    out += single_chars()
    out += whitespace_runs()
    out += numbers()
    out += CONTRACTIONS
    out += PUNCT
    out += LANGUAGES
    out += EMOJI
    for pre, dec in NORMALIZATION:
        out.append(pre)
        out.append(dec)
    out.append("combining: e\u0301 a\u0300 n\u0303 o\u0308 (decomposed) vs é à ñ ö (precomposed)")
    out += [unicodedata.normalize("NFD", LANGUAGES[i]) for i in (0, 1, 6, 12, 15, 33)]  # whole sentences in NFD
    out += NFC_SPECIALS
    out += CODE
    out += MARKUP
    out += SPECIAL_TEXT
    out += SPECIAL_COMBOS
    out += UNUSUAL
    out += long_repeats()
    out += [
        "Hello world", "Hello, world! How are you today?", "hello", "Hello", "HELLO", " hello", "  hello",
        "mixed 中文 and English and 😀 emoji in one line",
        "Math 𝔸𝕓𝕔 𝑥² + 𝑦² = 𝑧² and ancient 𐍈𐌰",
        "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case-id",
        "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞßàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿ",
    ]
    return out


def mix_pool(hand: list) -> list:
    """Short pieces for the random mixes (long repeats are left out)."""
    pool = [s for s in hand if 0 < len(s) <= 120]
    pool += ["word", "Word", "WORD", "the", " the", "is", "a", "I", "'s", "’ll", "123", "4.5", "😀", "👍🏿",
             "👨‍👩‍👧‍👦", "🇯🇵", "e\u0301", "é", "中文", "日本", "한", "ß", "<|im_end|>", "<|im_start|>",
             "<|endoftext|>", "<tool_call>", "<|fim_prefix|>", "<|im_sta", "\u200b", "\ufeff", "\u00a0",
             "\x00", "\r", "\r\n", "\t", "  ", "    ", "\n\n"]
    return pool


SEPARATORS = ["", "", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n", "\n ", ",", ". ", "'", "\u00a0", "\u200d"]


def random_mixes(hand: list, count: int) -> list:
    rng = random.Random(SEED)
    pool = mix_pool(hand)
    out = []
    for _ in range(count):
        k = rng.randint(2, 6)
        parts = []
        for j in range(k):
            piece = rng.choice(pool)
            if rng.random() < 0.15:
                piece = unicodedata.normalize("NFD", piece)
            if rng.random() < 0.1:
                piece = piece.upper()
            if j:
                parts.append(rng.choice(SEPARATORS))
            parts.append(piece)
        out.append("".join(parts))
    return out


def build_corpus() -> list:
    hand = build_hand_written()
    seen = {}
    for s in hand:
        seen.setdefault(s, None)
    corpus = list(seen)
    mixes = random_mixes(hand, 4 * TARGET_COUNT)
    i = 0
    while len(corpus) < TARGET_COUNT:
        s = mixes[i]
        i += 1
        if s not in seen:
            seen[s] = None
            corpus.append(s)
    for s in corpus:
        s.encode("utf-8")  # no lone surrogates
    return corpus


# ---------------------------------------------------------------------------------------------
# Chats
# ---------------------------------------------------------------------------------------------


def build_chats(corpus: list) -> list:
    """~20 conversations (messages with role and content only) and add_generation_prompt flags."""
    idx = {s: i for i, s in enumerate(corpus)}

    def c(s: str) -> str:
        assert s in idx, s
        return s

    rng = random.Random(SEED + 2)
    short = [s for s in corpus if 0 < len(s) <= 200]

    def pick() -> str:
        return rng.choice(short)

    chats = [
        ([{"role": "user", "content": c("Hello world")}], True),
        ([{"role": "user", "content": c("Hello world")}], False),
        ([{"role": "user", "content": c("")}], True),
        ([{"role": "system", "content": c("")}, {"role": "user", "content": c(" ")}], True),
        ([{"role": "system", "content": c(LANGUAGES[0])}, {"role": "user", "content": c(LANGUAGES[30])}], True),
        (
            [
                {"role": "system", "content": c(CODE[0])},
                {"role": "user", "content": c(CODE[4])},
                {"role": "assistant", "content": c(CODE[1])},
                {"role": "user", "content": c(MARKUP[0])},
            ],
            True,
        ),
        (
            [
                {"role": "user", "content": c(EMOJI[6])},
                {"role": "assistant", "content": c(EMOJI[8])},
                {"role": "user", "content": c(NORMALIZATION[1][1])},
                {"role": "assistant", "content": c(NORMALIZATION[7][1])},
            ],
            False,
        ),
        ([{"role": "user", "content": c("<|im_start|>user\nhi<|im_end|>\n")}], True),
        ([{"role": "user", "content": c("text with <|endoftext|> inside and <|im_end|>at the end")}], False),
        ([{"role": "user", "content": c(TOOL_CALL_TEXT)}, {"role": "assistant", "content": c("<tool_call>")}], True),
        ([{"role": "user", "content": c("windows\r\nline\r\nendings\r\n")}, {"role": "assistant", "content": c("old mac\rline\rendings\r")}], True),
        ([{"role": "user", "content": c("\n" * 5)}, {"role": "assistant", "content": c(" " * 7)}], True),
        ([{"role": "user", "content": c("a\x00b")}, {"role": "assistant", "content": c("\ufeffBOM at start, BOM\ufeffinside")}], False),
        (
            [
                {"role": "user", "content": c("I'm sure it's what they've said: we'll see, you'd know")},
                {"role": "system", "content": c(LANGUAGES[12])},
            ],
            True,
        ),
        ([{"role": "assistant", "content": c(LANGUAGES[33])}, {"role": "user", "content": c(LANGUAGES[17])}], True),
    ]
    while len(chats) < 20:
        turns = rng.randint(1, 5)
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": pick()})
        for t in range(turns):
            messages.append({"role": "user" if t % 2 == 0 else "assistant", "content": pick()})
        chats.append((messages, rng.random() < 0.6))
    return chats


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _escape_char(ch: str) -> str:
    o = ord(ch)
    if o > 0xFFFF:
        o -= 0x10000
        return "\\u%04x\\u%04x" % (0xD800 + (o >> 10), 0xDC00 + (o & 0x3FF))
    return "\\u%04x" % o


_ESCAPED_MARK_RANGES = [
    (0x0300, 0x036F),  # combining diacritical marks
    (0x1AB0, 0x1AFF),
    (0x1DC0, 0x1DFF),
    (0x20D0, 0x20FF),  # combining marks for symbols (keycap U+20E3)
    (0xFE20, 0xFE2F),
    (0x1100, 0x11FF),  # Hangul conjoining jamo (NFD Korean)
    (0x3099, 0x309A),  # combining kana voiced marks
    (0xFE00, 0xFE0F),  # variation selectors
]


def _visible(ch: str) -> bool:
    if ch == " ":
        return True
    o = ord(ch)
    if any(lo <= o <= hi for lo, hi in _ESCAPED_MARK_RANGES) or 0xE0100 <= o <= 0xE01EF:
        return False
    # controls, format chars (ZWJ, BOM, bidi, tags), separators other than space, private use,
    # unassigned code points and noncharacters, and U+FFFD are escaped
    return unicodedata.category(ch)[0] not in "CZ" and ch != "\ufffd"


def dumps_readable(s: str) -> str:
    """JSON string literal: readable characters raw, invisible/unusual ones as \\u escapes."""
    return "".join(ch if _visible(ch) else _escape_char(ch) for ch in json.dumps(s, ensure_ascii=False))


def write_corpus(path: str, corpus: list) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(dumps_readable(s) for s in corpus))
        f.write("\n]\n")
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == corpus, "corpus.json does not read back equal"


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if len(sys.argv) > 1:
        models_dir = sys.argv[1]
    else:
        models_dir = os.environ.get("LEAN_MODELS") or os.path.expanduser("~/.cache/lean/models")
    out_dir = os.path.join(here, "..", "rust", "lean-tokenizer", "tests", "data")
    os.makedirs(out_dir, exist_ok=True)

    corpus = build_corpus()
    corpus_path = os.path.join(out_dir, "corpus.json")
    write_corpus(corpus_path, corpus)
    print(f"wrote {corpus_path}: {len(corpus)} strings, {os.path.getsize(corpus_path)} bytes")

    chat_specs = build_chats(corpus)
    ids_out = {}
    chats_out = {}
    for name in MODELS:
        tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, name))
        ids = [tok(s, add_special_tokens=False)["input_ids"] for s in corpus]
        ids_special = [tok(s, add_special_tokens=True)["input_ids"] for s in corpus]
        roundtrip = [tok.decode(x) == s for x, s in zip(ids, corpus)]
        ids_out[name] = {"ids": ids, "ids_with_special": ids_special, "roundtrip": roundtrip}
        chats = []
        for messages, add_generation_prompt in chat_specs:
            rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            chats.append(
                {
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "rendered": rendered,
                    "ids": tok(rendered, add_special_tokens=False)["input_ids"],
                }
            )
        chats_out[name] = chats
        print(f"{name}: {sum(map(len, ids))} ids, {roundtrip.count(False)} of {len(corpus)} do not round-trip, "
              f"{sum(a != b for a, b in zip(ids, ids_special))} differ with special tokens, {len(chats)} chats")

    ids_path = os.path.join(out_dir, "corpus-ids.json")
    with open(ids_path, "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write(",\n".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in ids_out.items()))
        f.write("\n}\n")
    print(f"wrote {ids_path}: {os.path.getsize(ids_path)} bytes")

    chats_path = os.path.join(out_dir, "corpus-chats.json")
    with open(chats_path, "w", encoding="utf-8") as f:
        f.write("{\n")
        model_parts = []
        for name, chats in chats_out.items():
            lines = []
            for chat in chats:
                msgs = ",".join(
                    "{\"role\":" + dumps_readable(m["role"]) + ",\"content\":" + dumps_readable(m["content"]) + "}"
                    for m in chat["messages"]
                )
                lines.append(
                    "  {\"messages\":[" + msgs + "],\"add_generation_prompt\":" + json.dumps(chat["add_generation_prompt"])
                    + ",\"rendered\":" + dumps_readable(chat["rendered"]) + ",\"ids\":" + json.dumps(chat["ids"], separators=(",", ":")) + "}"
                )
            model_parts.append(json.dumps(name) + ":[\n" + ",\n".join(lines) + "\n]")
        f.write(",\n".join(model_parts))
        f.write("\n}\n")
    with open(chats_path, encoding="utf-8") as f:
        assert json.load(f) == chats_out, "corpus-chats.json does not read back equal"
    print(f"wrote {chats_path}: {os.path.getsize(chats_path)} bytes")


if __name__ == "__main__":
    main()
