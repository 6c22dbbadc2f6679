"""Texts for the embedding model's tests, written for them.

``SENTENCES``: 200 varied inputs (short and long, punctuation, numbers, accents
and other scripts, odd spacing, special-token text), built from the lines below
so that each is different. ``QUESTIONS`` and ``PASSAGES``: a small retrieval
set; ``ANSWERS[i]`` is the index in ``PASSAGES`` of the passage that answers
``QUESTIONS[i]``; the other passages are on neighbouring subjects or share a
question's words and answer none of them.
"""

from __future__ import annotations

BASE = [
    "Hi.",
    "Yes!",
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "Where is the nearest train station?",
    "I can't believe it's already December; time flies.",
    "She paid $12.50 for two coffees and a croissant.",
    "The meeting moved from 3:30 p.m. to 4:15 p.m. on 2024-03-07.",
    "Pi is roughly 3.14159, and e is about 2.71828.",
    "Call +44 20 7946 0958 or e-mail info@example.org for details.",
    "Caf\u00e9 au lait, cr\u00e8me br\u00fbl\u00e9e and a na\u00efve r\u00e9sum\u00e9.",
    "Stra\u00dfe, \u00c5ngstr\u00f6m, \u00d8resund and \u0130stanbul are all spelled with care.",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002",
    "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439\u0442\u0435, "
    "\u043a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0395\u039b\u039b\u0391\u0394\u0391 and \u03a3\u039f\u03a6\u0399\u0391 in capital Greek letters.",
    "Emoji like \U0001f600 and \U0001f680 are not in the vocabulary.",
    "Tabs\tand\nnew lines\r\nand   many    spaces.",
    "Quotes: \u201cdouble\u201d, \u2018single\u2019, and \u00abguillemets\u00bb.",
    "Dashes \u2013 en, \u2014 em, and - hyphen; ellipsis\u2026",
    "C++ and C# differ; so do x**2 and x^2 (see RFC 7231, section 6.5.1).",
    "The [CLS] and [SEP] tokens are written here as plain text.",
    "antidisestablishmentarianism and pneumonoultramicroscopicsilicovolcanoconiosis",
    "HTTP/1.1 200 OK; Content-Type: application/json; charset=utf-8",
    "def add(a, b): return a + b  # a Python function",
    "50% of 80 is 40, and 1/3 is 0.333...",
    "Mount Everest is 8,849 metres high.",
    "The river Thames flows through London to the North Sea.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "He said: \"Don't forget the keys!\" and left.",
    "Item #42 costs \u20ac19.99 (VAT incl.) \u2014 \u00a315 in the UK.",
    "A\u0301 combining accent, and a precomposed \u00c1.",
    "Sch\u00f6ne Gr\u00fc\u00dfe aus M\u00fcnchen!",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.",
    "The year 1969 saw the first landing on the Moon.",
    "Water boils at 100 \u00b0C (212 \u00b0F) at sea level.",
    "Version 2.0.1-rc3 fixes bug #1234.",
    "ALL CAPS SENTENCES SHOULD EMBED LIKE LOWER CASE ONES.",
    "Zero-width\u200bspace and soft\u00adhyphen inside words.",
]

LONG = (
    "On a grey morning the ferry left the harbour, carrying trucks, cyclists and a few tourists who stood at "
    "the rail to watch the gulls. The captain, who had crossed this strait more than four thousand times, "
    "spoke quietly to the pilot about the wind, the tide and the fog that was expected after noon. "
)

FORMS = [
    lambda s: s,
    lambda s: s.upper(),
    lambda s: f"{s} (note {len(s)})",
    lambda s: f"\u00bb {s} \u00ab",
    lambda s: (LONG + s) * 2,
    lambda s: f"{s.lower()} -- {s}",
]


def _sentences() -> list[str]:
    out: list[str] = []
    for form in FORMS:
        for s in BASE:
            text = form(s)
            if text not in out:
                out.append(text)
    return out[:200]


SENTENCES = _sentences()

# (question, passage that answers it)
PAIRS = [
    ("How do plants make their food?",
     "Plants use sunlight to turn water and carbon dioxide into glucose, releasing oxygen: photosynthesis."),
    ("What is the boiling point of water?", "At sea level water boils at one hundred degrees Celsius."),
    ("Who wrote Romeo and Juliet?", "The tragedy of the two young lovers of Verona was written by Shakespeare."),
    ("What is the capital of Japan?", "Tokyo, the largest city of Japan, has been its capital since 1868."),
    ("How many legs does a spider have?", "Spiders are arachnids with eight legs and usually eight eyes."),
    ("What causes the tides?", "Tides rise and fall because of the gravitational pull of the Moon and the Sun."),
    ("How do I reset my password?",
     "To change a forgotten password, click 'Forgot password' on the login page and follow the e-mailed link."),
    ("When did humans first land on the Moon?", "Apollo 11 put Neil Armstrong on the lunar surface in July 1969."),
    ("What is the tallest mountain on Earth?", "Mount Everest, in the Himalaya, rises 8,849 metres above sea level."),
    ("Which planet is known as the red planet?", "Mars looks red because of iron oxide dust on its surface."),
    ("How does a vaccine work?",
     "Vaccines train the immune system to recognise a pathogen so that it can fight a later infection."),
    ("What is the speed of light?", "Light travels through a vacuum at about 300,000 kilometres per second."),
    ("How can I make my bread rise better?",
     "Yeast dough rises best in a warm place; knead it well and let it prove until doubled in size."),
    ("What do bees produce?", "Honey bees make honey from flower nectar and store it in wax combs."),
    ("Why is the sky blue?", "Air molecules scatter short blue wavelengths of sunlight more than red ones."),
    ("How long does it take the Earth to orbit the Sun?",
     "Our planet completes one revolution around the Sun in about 365.25 days."),
    ("What is the largest ocean?", "The Pacific is the biggest and deepest of the world's oceans."),
    ("How do I fix a flat bicycle tyre?",
     "Remove the wheel, take out the inner tube, find the puncture, patch it, and pump the tyre up again."),
    ("What language is spoken in Brazil?", "Most Brazilians speak Portuguese, a legacy of colonial rule."),
    ("What is the chemical symbol for gold?", "Gold's symbol Au comes from its Latin name, aurum."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the portrait of Lisa Gherardini in the early 1500s."),
    ("How many continents are there?",
     "Geographers usually count seven continents, from Africa to Antarctica."),
    ("What is the main ingredient of guacamole?", "Guacamole is a Mexican dip made mostly of mashed avocado."),
    ("How do I brew a good cup of tea?",
     "Pour freshly boiled water over the leaves and let them steep for three to five minutes."),
    ("What is the freezing point of water in Fahrenheit?", "Pure water freezes at 32 degrees Fahrenheit."),
    ("Which animal is the largest on Earth?", "The blue whale, up to 30 metres long, is the biggest animal ever."),
    ("What does DNA stand for?", "DNA is short for deoxyribonucleic acid, the molecule that carries genes."),
    ("How do I cancel my subscription?",
     "You can end your plan at any time from the Billing page of your account settings."),
    ("What currency is used in Japan?", "The yen is the official money of Japan."),
    ("How do airplanes stay in the air?",
     "Wings are shaped so that moving air produces lift, which holds the aircraft up against gravity."),
    ("Who discovered penicillin?", "Alexander Fleming noticed in 1928 that a mould killed bacteria."),
    ("What is the longest river in the world?", "The Nile, flowing north through Africa, is usually cited as longest."),
    ("How many players are on a football team?", "A soccer side fields eleven players, including the goalkeeper."),
    ("What is the hardest natural substance?", "Diamond, a form of carbon, is the hardest natural material."),
    ("How can I improve my sleep?",
     "Keep a regular bedtime, avoid screens and caffeine late in the day, and keep the bedroom dark."),
    ("What gas do humans exhale?", "When we breathe out, our lungs release carbon dioxide."),
    ("Where do kangaroos live?", "Kangaroos are marsupials found in the wild only in Australia."),
    ("What is the square root of 144?", "Twelve multiplied by twelve gives 144."),
    ("How do I back up my phone?",
     "Turn on cloud backup in the phone's settings, or copy its data to a computer with a cable."),
    ("What instrument has 88 keys?", "A standard piano keyboard has 88 black and white keys."),
    ("Why do leaves change colour in autumn?",
     "As days shorten, trees stop making chlorophyll, revealing yellow and orange pigments in their leaves."),
    ("What is the population of the world?", "About eight billion people live on Earth today."),
    ("How does a refrigerator keep food cold?",
     "A fridge pumps a refrigerant that absorbs heat inside the cabinet and releases it at the back."),
    ("Who invented the telephone?", "Alexander Graham Bell was granted the first telephone patent in 1876."),
    ("What is the smallest prime number?", "Two is the only even prime and the smallest one."),
    ("How do I remove a red wine stain?",
     "Blot the stain, cover it with salt or baking soda, then rinse with cold water before washing."),
    ("What do pandas eat?", "Giant pandas feed almost entirely on bamboo shoots and leaves."),
    ("How far is the Moon from the Earth?", "The Moon orbits at an average distance of about 384,400 km."),
    ("What is the official language of Argentina?", "Spanish is the national language of Argentina."),
    ("How do solar panels generate electricity?",
     "Photovoltaic cells in the panels convert sunlight directly into an electric current."),
]

# passages on neighbouring subjects, answering none of the questions
DISTRACTORS = [
    "Cacti store water in their thick stems and survive long droughts.",
    "Steam engines powered the railways of the nineteenth century.",
    "Marlowe's plays were staged in London in the 1580s and 1590s.",
    "Osaka is known for its food, its castle and its merchants.",
    "Insects have six legs and three body segments.",
    "Waves are raised by the wind blowing over the surface of the sea.",
    "Usernames may contain letters, digits and underscores.",
    "The International Space Station orbits Earth every ninety minutes.",
    "K2 is the second-highest mountain and one of the hardest to climb.",
    "Jupiter is the largest planet of the Solar System.",
    "Antibiotics kill bacteria but do nothing against viruses.",
    "Sound travels through air at about 343 metres per second.",
    "Sourdough uses wild yeast and lactic bacteria instead of baker's yeast.",
    "Wasps can sting more than once, unlike honey bees.",
    "Sunsets look red because light crosses more air near the horizon.",
    "A day on Venus is longer than its year.",
    "The Dead Sea is so salty that swimmers float easily.",
    "Chain lubrication keeps a bicycle running smoothly.",
    "Quechua is still spoken by millions in the Andes.",
    "Silver tarnishes when it reacts with sulphur in the air.",
    "Van Gogh painted The Starry Night in 1889.",
    "Antarctica is the coldest and windiest place on Earth.",
    "Salsa verde is made with tomatillos and green chillies.",
    "Coffee beans are roasted seeds of the Coffea plant.",
    "Mercury is a metal that is liquid at room temperature.",
    "Elephants are the largest land animals.",
    "RNA carries genetic instructions from DNA to the ribosomes.",
    "Refunds are issued to the original payment method within ten days.",
    "The euro is used by twenty countries of the European Union.",
    "Helicopters fly with rotating blades rather than fixed wings.",
    "Marie Curie won Nobel prizes in physics and in chemistry.",
    "The Amazon carries more water than any other river.",
    "Basketball teams have five players on the court.",
    "Graphene is a single layer of carbon atoms.",
    "Regular exercise improves mood and heart health.",
    "Plants take in carbon dioxide through pores in their leaves.",
    "Koalas sleep up to twenty hours a day.",
    "The cube of three is twenty-seven.",
    "Laptops should be kept away from heat and moisture.",
    "A violin has four strings tuned in fifths.",
    # words of the questions, other subjects
    "Plants in the office make their food court look greener, the architects say.",
    "Boiling point is also the name of a film set in a restaurant kitchen.",
    "Romeo and Juliet is a famous ballet by Prokofiev, first danced in 1938.",
    "The capital raised by Japan's start-ups grew last year.",
    "A spider plant has long green and white leaves and needs little light.",
    "The Tides is the name of a hotel on the Miami beach front.",
    "Reset the router by holding its button for ten seconds; the password on its label still works.",
    "Humans first landed on the Moon in the 1969 novel of a lunar landing, the film critics wrote.",
    "The tallest building on Earth is the Burj Khalifa in Dubai.",
    "The Red Planet is a science fiction novel by Robert Heinlein.",
    "The vaccine work schedule at the clinic changes every Monday.",
    "The speed of light reading depends on the lamp, the page and your eyes.",
    "Make bread crumbs better by drying the slices in a low oven.",
    "Bees are the mascot of the city of Manchester.",
    "Why the sky is blue is a question children often ask their parents.",
    "The Earth orbits are the subject of the exhibition at the science museum this year.",
    "The largest ocean liner ever built carried over six thousand passengers.",
    "Fix a flat battery in your car with jump leads and another car.",
    "Brazil won the football World Cup five times.",
    "Gold medals at the Olympics are mostly made of silver.",
    "The Mona Lisa was stolen from the Louvre in 1911 and found two years later.",
    "How many continents a traveller visits is a point of pride for some.",
    "Guacamole was served at the party, next to salsa and chips.",
    "A good cup for tea is made of porcelain or glass.",
    "Fahrenheit 451 is a novel by Ray Bradbury about burning books.",
]

QUESTIONS = [q for q, _ in PAIRS]
PASSAGES = [p for _, p in PAIRS] + DISTRACTORS
ANSWERS = list(range(len(PAIRS)))


def recall_at(k: int, question_vectors, passage_vectors) -> float:
    """The share of questions whose answering passage is among the ``k`` nearest
    passages by cosine similarity (the vectors are L2-normalised)."""
    import numpy as np

    scores = np.asarray(question_vectors) @ np.asarray(passage_vectors).T
    top = np.argsort(-scores, axis=1)[:, :k]
    return float(np.mean([ANSWERS[i] in top[i] for i in range(len(QUESTIONS))]))
