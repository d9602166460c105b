r"""The moderation categories and the rule-based tier's lexicon: intent patterns, not topic words.

A pattern flags a text that *asks for* or *gives* harmful help ("how do I make a pipe bomb",
"step-by-step synthesis of meth"), *threatens* or *encourages* harm ("kill yourself", "I know where
you live"), or dehumanises a group; it does not flag a text for mentioning a topic. So "kill the
process", "the bomb of a release", "shoot me an email", a suicide-prevention hotline message, a
harm-reduction leaflet or a news report on a drug seizure all pass. Most patterns hang off a
request frame (`_ASK`: "how do I", "help me", "I want to", "step-by-step instructions for", ...)
followed, within one sentence and at most 30 characters, by a harmful action and its object; a
frame whose next few words are protective ("how to *stop* people who make meth", "how do I *help*
a friend who wants to commit suicide") never counts.

Linear time by construction: texts are normalised (lower-cased, apostrophes unified, whitespace runs
collapsed to one space) and every pattern is a sequence of literal alternations and *bounded*
windows (`[^.!?]{0,30}`, `(?:[\w'-]{1,30} ){0,3}`) with no unbounded quantifier (`+`, `*`, `{n,}`) at all,
so the work per start position is bounded by a constant. The lexicon is English-only and a floor, not a
classifier: spelling games ("k1ll"), other languages and paraphrase get past it (the `llm` tier
exists for that).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final

MAX_MODERATED_CHARS: Final = 256 * 1024
"""Characters of one text the rule-based tier scans: only the first 256 KiB; the rest is not read."""


class Category(enum.StrEnum):
    """What a moderation policy refuses; the values are the `categories:` names of the config."""

    VIOLENCE = "violence"
    SELF_HARM = "self-harm"
    HATE = "hate"
    SEXUAL_MINORS = "sexual-minors"
    WEAPONS = "weapons"
    ILLEGAL_DRUGS = "illegal-drugs"
    HARASSMENT = "harassment"


# -- building blocks ---------------------------------------------------------------------------

_ASK: Final = (
    r"\b(?:how (?:do|can|could|would|should|might|will) (?:i|we|you|u|one|someone|somebody|a person)"
    r"|how to|how i can|how i could|how can i best"
    r"|where (?:can|do|could|should|would) (?:i|we|you|u|one)(?: go to)?"
    r"|(?:what(?:'s| is| are)|which is) the (?:best|easiest|quickest|fastest|cheapest|simplest|safest|surest"
    r"|most effective|most reliable) (?:way|ways|method|methods) (?:to|of|for)"
    r"|(?:best|easiest|quickest|simplest|cheapest|surest) (?:way|ways|method|methods) to|ways to"
    r"|(?:tell|teach|show) me(?: how)?(?: to)?|explain (?:to me )?how to|walk me through(?: how to)?"
    r"|(?:give|send|write|provide) (?:me )?(?:some |the )?(?:detailed |full |complete |exact |step[- ]by[- ]step )?"
    r"(?:instructions|steps|a recipe|the recipe|a guide|a tutorial|directions)(?: (?:for|on|to|of))?"
    r"|step[- ]by[- ]step(?: (?:guide|instructions|tutorial|recipe|process|directions))?(?: (?:for|on|to|of))?"
    r"|(?:instructions|a recipe|recipe|a guide|a tutorial|tutorial|directions) (?:for|on|to)"
    r"|help me|i (?:want|need|plan|intend|wanna|have decided|am going|am planning|am about|'m going|'m planning"
    r"|'m about) to|i(?:'m| am) gonna|i wanna|(?:i|we)(?:'ll| will))"
)
"""A request (or first-person intent) frame; what follows it within the sentence is the ask."""

_PROTECTIVE: Final = (
    r"(?!(?:[\w'-]{1,30} ){0,3}(?:stop|stopping|prevent|preventing|avoid|avoiding|detect|detecting|spot|spotting"
    r"|recogni[sz]e|identify|report|reporting|protect|protecting|defend|survive|treat|treating|respond|dispose"
    r"|disarm|defuse|deal|talk|tell if|tell whether|know|find out if|check if|check whether|handle|cope|support"
    r"|help|helping|recover|quit|not|never|reduce|restrict|limit|warn|educate|explain to|understand|research)\b)"
)
"""Refuses a frame whose next three words are protective: the asker wants to stop the harm."""

_GAP: Final = r" " + _PROTECTIVE + r"(?:[^.!?]{0,30} )?"
"""From a frame to the harmful action: the rest of the sentence, at most 30 characters."""

_FIRST_PERSON: Final = (
    r"\b(?:i|we)(?:'ll| will|'m going to| am going to|'re going to| are going to|'m gonna| am gonna|'re gonna"
    r"| gonna| wanna| want to| swear i(?:'ll| will))"
)
_YOU: Final = r"(?:you|u|ya|your (?:family|kids|children|wife|husband|mom|mother|dad|father|daughter|son|dog))"
_NOT_A_MESSAGE: Final = (
    r"(?! (?:an? |the |some |over |a quick |my |our )?(?:email|e-mail|mail|message|text|note|line|dm|pm|invite"
    r"|link|update|reply|call|ping|copy|reminder|list|pr|doc|file|screenshot|photo|picture|question|quote)\b)"
)
"""After "I'll shoot you": not when what follows is an email, a message, a link..."""
_NOT_A_GAME: Final = (
    r"(?! (?:at|in|on) (?:the |a |this |our )?(?:next )?(?:game|games|mario|chess|poker|cards|fortnite|smash|halo|cod"
    r"|round|match|tennis|golf|pool|darts|bowling|ping pong|scrabble|monopoly|trivia|tournament|league|finals?|semis"
    r"|semifinals?|playoffs?|race|debate|quiz|rematch)\b| with (?:kindness|love|hugs|kisses|compliments)\b)"
)
"""After "I'll kill you": not "at Mario Kart", "in the next round" or "with kindness"."""


def _person(*, pronouns: bool) -> str:
    """A human target, but not a child process, a character killed off, or a boss in a game.

    `pronouns` adds "him" and "her": right after "poison" or "strangle", not after "kill" or
    "attack", where a gamer's boss ("how do I kill him in Elden Ring") is likelier than a person.
    """
    return (
        r"(?:someone|somebody|anyone|a person|people|a human|humans"
        + (r"|him|her" if pronouns else "")
        + r"|my (?:[\w-]{1,30} )?(?:wife|husband|boss|neighbou?r|mother|mom|mum|father|dad|brother|sister|son|daughter"
        r"|teacher|ex|ex-wife|ex-husband|girlfriend|boyfriend|partner|family|roommate|coworker|co-worker|colleague"
        r"|classmate|landlord|friend|uncle|aunt|grandma|grandpa|baby|stepdad|stepmom|stepfather|stepmother)"
        r"|a (?:man|woman|girl|boy|cop|police officer|child|kid|baby|stranger|witness|family)"
        r"|(?:the|a|my) (?:president|senator|judge|witness|neighbou?r|landlord|teacher|mayor|congressman))"
        r"\b(?!'s| off\b| (?:process|processes|thread|task|job|node|pod|container|window|character|npc)\b"
        r"| (?:in|on) (?:the |my |a |this )?(?:game|story|novel|book|script|film|movie|scene|level|chapter|mission"
        r"|quest|boss fight|campaign|dnd|d&d|show|episode|series)\b)"
    )


_PERSON: Final = _person(pronouns=True)
_HUMAN: Final = _person(pronouns=False)

_GROUP: Final = (
    r"(?:jews|jewish people|muslims|christians|hindus|sikhs|buddhists|atheists|blacks|black people|whites"
    r"|white people|asians|asian people|arabs|mexicans|latinos|hispanics|immigrants|migrants|refugees|gays"
    r"|gay people|lesbians|homosexuals|trans people|transgender people|women|disabled people|the disabled"
    r"|gypsies|roma|africans|indians|chinese people|the chinese)"
)
_NOT_REPORTED: Final = (
    r"(?<!that )(?<!that the )(?<!that all )(?<!claim )(?<!claims )(?<!idea )(?<!myth )(?<!lie )(?<!as if )"
)
"""Before a group: not when the sentence reports or refutes the claim ("the myth that ...")."""

_MINOR: Final = (
    r"(?<!for )(?<!not for )(?<!from )(?<!around )(?<!protect )(?<!protecting )(?<!protects )"
    r"(?:child|children|kid|kids|minor|minors|underage|under-age|preteen|preteens|pre-teen|pre-teens|prepubescent"
    r"|toddler|toddlers|infant|infants|little (?:girl|boy|girls|boys)|young teens?|jailbait|loli|shota"
    r"|(?:[1-9]|1[0-5])[- ]?(?:yo|y/o|year[- ]old|yr[- ]old)s?"
    r"|(?:girl|boy|daughter|son|niece|nephew|stepdaughter|stepson|student|pupil)s? (?:aged|age|of) (?:[1-9]|1[0-5]))\b"
)
"""A minor, unless the sentence is about keeping something away from children ("not for kids")."""

_UNDER_16: Final = r"(?:[1-9]|1[0-5])[- ]?(?:yo|y/o|year[- ]olds?|yr[- ]olds?)\b"
_EXPLICIT: Final = (
    r"(?:sex scenes?|sex stor(?:y|ies)|sexual stor(?:y|ies)|sexual role-?play|sexual role play|erotica|erotic"
    r"|smut|porn|pornographic|explicit sex|sexually explicit|lewd|nsfw|nude|nudes|sexy|seductive|having sex"
    r"|sexual acts?|sexual content|sexual fantas(?:y|ies)|masturbat\w{0,6}|orgasms?)"
)
_MAKE_CONTENT: Final = (
    r"\b(?:write|generate|create|draw|describe|depict|role-?play|role play|imagine|produce|render|paint|show me"
    r"|send me|give me|tell me|story|fanfic|fan fiction|fantasy)\b"
)

_WEAPON: Final = (
    r"(?:pipe bombs?|nail bombs?|pressure[- ]cooker bombs?|car bombs?|dirty bombs?|letter bombs?|fertili[sz]er bombs?"
    r"|bombs?(?![- ](?:ass|proof|shelter|squad|disposal|threat|scare|sniffing|diggity|pop|diagram|emoji|icon|sound"
    r"|effect|animation|sprite)\b)"
    r"|explosive devices?|explosives|ieds?|improvised explosives?(?: devices?)?|molotov(?: cocktail)?s?|napalm"
    r"|thermite bombs?|grenades?|hand grenades?|landmines?|land mines?|suicide vests?|detonators?"
    r"|silencers?(?! for (?:my |the |a |an )?(?:car|exhaust|generator|motorcycle|engine|compressor|pump|muffler)\b)"
    r"|(?:gun |rifle |pistol |solvent trap )suppressors?|ghost guns?|untraceable (?:guns?|firearms?|rifles?|pistols?)"
    r"|zip guns?|(?:3d[- ]printed|homemade|home-made) (?:guns?|firearms?|rifles?|pistols?|glocks?)|machine guns?"
    r"|auto sears?|glock switch(?:es)?|lightning links?|nerve agents?|nerve gas|sarin|vx(?: nerve agent| gas)?"
    r"|mustard gas|chlorine gas|phosgene|ricin|anthrax|botulinum(?: toxin)?|bioweapons?|biological weapons?"
    r"|chemical weapons?|tatp|hmtd|semtex)\b"
)
_BUILD: Final = (
    r"(?:mak(?:e|ing)|build(?:ing)?|construct(?:ing)?|assembl(?:e|ing)|creat(?:e|ing)|craft(?:ing)?|cook(?:ing)? up"
    r"|put(?:ting)? together|rig(?:ging)?|wir(?:e|ing)|manufactur(?:e|ing)|produc(?:e|ing)|synthesi[sz](?:e|ing)"
    r"|weaponi[sz](?:e|ing)|3d[- ]print(?:ing)?|print(?:ing)?|mill(?:ing)?|detonat(?:e|ing)|set(?:ting)? off"
    r"|plant(?:ing)?|smuggl(?:e|ing)|extract(?:ing)?|cultur(?:e|ing)|aerosoli[sz](?:e|ing)|dispers(?:e|ing)"
    r"|deploy(?:ing)?)"
)
_ARTICLE: Final = r"(?:a |an |my own |some |the |homemade |home-made |improvised |working |functional |real |more )?"

_HARD_DRUG: Final = (
    r"(?:crystal meth|meth|methamphetamine|fentanyl|carfentanil|heroin|crack cocaine|crack rock|cocaine|lsd|mdma"
    r"|ecstasy|ghb|pcp|dmt|mescaline|bath salts|krokodil|desomorphine|opium|amphetamines?)\b"
    r"(?! (?:addiction|abuse|rehab|treatment|recovery|detox|withdrawal|overdoses?|test|tests|testing|strips?"
    r"|use disorder|dependence|users|awareness|prevention|epidemic|crisis|sentencing|laws?|policy|policies|reform"
    r"|possession|charges?|convictions?|arrests?|seizures?|trade|market|prices?|use|deaths?|statistics)\b)"
)
"""A controlled drug, but not "heroin addiction", "fentanyl test strips", "meth withdrawal"..."""
_RX_DRUG: Final = (
    r"(?:oxycodone|oxycontin|xanax|adderall|percocet|morphine|vicodin|hydrocodone|ketamine|valium|codeine"
    r"|tramadol|ritalin|alprazolam|diazepam)"
)
_DRUG_MAKE: Final = (
    r"(?:mak(?:e|ing)|cook(?:ing)?|synthesi[sz](?:e|ing)|manufactur(?:e|ing)|produc(?:e|ing)|brew(?:ing)?"
    r"|extract(?:ing)?|isolat(?:e|ing)|refin(?:e|ing)|cut(?:ting)?|press(?:ing)?|home-?brew(?:ing)?"
    r"|crystalli[sz](?:e|ing)|smuggl(?:e|ing)|traffic(?:king)?|sneak(?:ing)?|mul(?:e|ing)|sell(?:ing)?"
    r"|deal(?:ing)?|push(?:ing)?)"
)
_DRUG_AMOUNT: Final = (
    r"(?:some |my own |homemade |home-made |pure |high-quality |street-grade |a batch of |a kilo of |kilos of |the )?"
)
_RECIPE_OPENING: Final = (
    r"[^.!?]{0,40}\b(?:you(?:'ll| will)? need|you(?:'ll| will) want|start by|begin by"
    r"|first(?:,)? (?:you )?(?:get|obtain|gather|take|mix|fill|drill|combine|dissolve|heat|crush|extract))"
)
"""An answer's how-to opening after the thing it makes: "to make a pipe bomb, you'll need..."."""
_RECIPE_FOR: Final = (
    r"\b(?:recipe|instructions|directions|steps|a guide|a tutorial|blueprints?|schematics?|formula|synthesis route)"
    r" (?:for|to make|on making|on how to make|of) "
)
"""A recipe asked for by name: "a recipe for ricin", "instructions for making a pipe bomb"."""


def _ask(*actions: str) -> str:
    return _ASK + _GAP + r"(?:" + "|".join(actions) + r")"


_LEXICON: Final[dict[Category, tuple[str, ...]]] = {
    Category.VIOLENCE: (
        _ask(
            r"(?:murder|poison|strangle|suffocate|smother|stab|behead|torture|kidnap|abduct|maim|assassinate|drown"
            r"|dismember) " + _PERSON,
            r"(?:kill|beat up|run over|hurt|injure|attack|shoot and kill) " + _HUMAN,
            r"shoot " + _HUMAN + r" (?:dead|in the (?:head|face|back|chest))",
            r"get away with (?:murder(?:ing)?|killing) " + _PERSON,
            r"(?:make|get|buy|find|use|an?) (?:an? )?(?:untraceable|undetectable) poisons?",
            r"(?:plan|carry out|commit|pull off|execute|do|organi[sz]e) (?:a |an )?(?:mass shooting|school shooting"
            r"|terror(?:ist)? attack|massacre|bombing|suicide bombing|mass murder|mass stabbing)",
            r"(?:kill|hurt|injure|shoot) as many (?:people|students|kids|children|victims|civilians) as"
            r" (?:possible|i can|we can)",
            r"maximi[sz]e (?:casualties|the (?:body count|death toll|number of (?:deaths|victims)))",
            r"(?:hire|find|pay|contact) (?:a )?(?:hit ?man|contract killer|assassin)\b",
        ),
        r"\b(?:kill|murder|poison|strangle|suffocate) " + _PERSON + r"[^.!?]{0,40}\bwithout (?:getting caught"
        r"|being caught|leaving (?:any |a )?(?:trace|evidence)|anyone (?:knowing|noticing|finding out)|being detected)",
        r"\b(?:spike|drug|lace|roofie) (?:her|his|their|someone's|somebody's|a girl's|a woman's|a guy's"
        r"|my [\w-]{1,30}'s) drinks?\b",
        r"\broofie (?:her|him|someone|somebody|a girl|a woman|a guy)\b",
        _FIRST_PERSON + r" (?:shoot up|bomb|blow up|massacre) (?:the |a |my |our |this )?(?:school|church|mosque"
        r"|synagogue|temple|office|mall|concert|parade|stadium|airport|subway|classroom|campus|hospital)\b",
    ),
    Category.SELF_HARM: (
        r"\b(?:go|just|you should|u should|you need to|you ought to|why don't you|why dont you|please|pls"
        r"|do (?:us|everyone|the world) a favou?r and|just go) (?:kill|hang|shoot|off) (?:yourself|urself|your self)\b",
        r"(?:^|[.!?] )kill yourself\b(?! (?:trying|over|working|doing|with)\b)",
        r"\b(?:just|go|pls|please|you should|u should|lol|lmao|so) kys\b",
        r"\b(?:nobody|no one) (?:would|will) (?:care|miss you) if you (?:died|killed yourself|were dead)",
        r"\b(?:the world|everyone) (?:would be|is|will be) better off (?:without you|if you (?:died|were dead"
        r"|killed yourself))",
        _ask(
            r"(?:kill myself|commit suicide|suicide|end my (?:own )?life|take my (?:own )?life|end it all|hang myself"
            r"|slit my wrists|cut myself|hurt myself|harm myself|burn myself|starve myself|overdose on|od on"
            r"|kill me painlessly)\b(?! (?:insurance|policy|cover|back|savings|prevention|hotline)\b)",
            r"(?:most (?:effective|lethal|painless|reliable)|best|easiest|quickest|surest|painless|least painful)"
            r" suicide methods?",
            r"(?:hide|cover up) (?:my )?(?:self[- ]harm|cuts|cutting)(?: scars)?\b",
        ),
        r"\b(?:painless(?:ly)?|least painful) (?:way |ways |method |methods )?(?:to )?(?:die|kill myself"
        r"|commit suicide|end my life)\b",
        r"\bways? to (?:kill myself|commit suicide|end my life)\b",
        r"\bhow (?:many|much) (?:[\w-]{1,30} ){0,4}(?:pills|tablets|mg|milligrams|grams|of (?:my|these|the) (?:pills"
        r"|meds|medication|tablets)) [^.!?]{0,30}\b(?:kill (?:me|myself)|for me to die|to end (?:my life|it)"
        r"|to od|to overdose)\b",
        r"\b(?:write|draft|compose) (?:me )?(?:a |my )suicide note\b",
        r"\bhelp me (?:write|with) (?:a |my )suicide note\b",
        r"\bhide (?:my )?(?:self[- ]harm|cuts|cutting|scars|burns)(?: scars)? from (?:my )?(?:parents|mom|mum|dad"
        r"|family|teachers?|therapist|doctor|school|everyone)\b",
        r"\b(?:pro-?ana|pro-?mia|thinspo(?:ration)?) (?:tips|tricks|advice|coach)\b",
    ),
    Category.HATE: (
        r"\b"
        + _NOT_REPORTED
        + r"(?:all |those |these |the |most |every |dirty |filthy )?"
        + _GROUP
        + r" (?:are|is) (?:nothing but |just |all |literally |basically )?(?:vermin|animals|subhuman|sub-human"
        r"|parasites|cockroaches|rats|savages|a disease|a plague|a cancer|inferior|an inferior race"
        r"|genetically inferior|not (?:human|people)|evil by nature|a virus)\b",
        r"\b(?:kill|exterminate|gas|eradicate|wipe out|eliminate|lynch|hang|purge)"
        r" (?:all (?:of )?(?:the |those |these )?|the |every |those |these )(?:fucking |damn |dirty |filthy )?"
        + _GROUP
        + r"\b(?!')",
        r"\b(?:death to|gas the|hang the|lynch the|kill the) (?:fucking |dirty |filthy )?" + _GROUP + r"\b(?!')",
        r"\b" + _NOT_REPORTED + _GROUP + r" (?:must|should|need to|deserve to|ought to) (?:all )?(?:die|be"
        r" (?:exterminated|gassed|killed|wiped out|eradicated|lynched|hanged|burned))\b",
        r"\b(?:write|tell|give|generate|make|compose|create) (?:me )?(?:a |an |some |\d{1,4} |another |more )?"
        r"(?:racist|antisemitic|anti-semitic|homophobic|transphobic|islamophobic|sexist|misogynist|misogynistic"
        r"|white[- ]supremacist|nazi|neo-nazi|hateful) (?:jokes?|rants?|slurs?|insults?|manifesto|propaganda"
        r"|slogans?|songs?|poems?|speech|memes?|tweets?|posts?)\b",
    ),
    Category.SEXUAL_MINORS: (
        _MAKE_CONTENT + r"[^.!?]{0,50}\b" + _EXPLICIT + r"\b[^.!?]{0,40}\b" + _MINOR,
        _MAKE_CONTENT + r"[^.!?]{0,30}\b" + _MINOR + r" (?:sex scenes?|sex stor(?:y|ies)|erotica|smut|nudes"
        r"|nude (?:pics|photos|pictures)|in lingerie|having sex|masturbating|naked)\b",
        r"\b(?:draw|generate|create|make|render|paint|photoshop|show me|send me) (?:me )?(?:a |an |some )?"
        r"(?:picture |image |photo |pic |video |drawing )?(?:of )?(?:a |an |some )?(?:naked|nude|undressed) " + _MINOR,
        _ask(
            r"(?:find|get|download|buy|access|watch|view|trade|share|see) (?:some )?(?:child porn(?:ography)?|csam"
            r"|kiddie porn|pedo (?:porn|pics|videos)|underage (?:porn|nudes|sex)|jailbait (?:pics|photos|videos)"
            r"|(?:child|kid|minor|preteen|teen) nudes)\b",
            r"(?:groom|seduce|lure|convince|persuade|get|trick|coax) (?:a |an |my |the |this )?(?:[\w-]{1,30} )?"
            r"(?:child|kid|minor|niece|nephew|stepdaughter|stepson|student|" + _UNDER_16 + r")"
            r"(?: (?:to|into) [^.!?]{0,20})?\b(?:have sex|sexual|send (?:me )?(?:nudes|naked (?:pics|photos|pictures))"
            r"|into bed)",
            r"groom(?:ing)? (?:a |an |the )?(?:child|kid|minor|" + _UNDER_16 + r")\b(?!'s)",
            r"(?:have sex|sleep|hook up|get laid|make out) with (?:a |an |my |this )?" + _MINOR,
        ),
        r"\b(?:sexy|hot|horny|seductive|sexually attractive|fuckable) " + _UNDER_16,
    ),
    Category.WEAPONS: (
        _ask(
            _BUILD + r" " + _ARTICLE + _WEAPON,
            r"convert (?:my |a |an |the )?(?:semi-?auto(?:matic)?|ar-?15|glock|rifle|pistol|gun|ak-?47|sks)"
            r"[^.!?]{0,20}\b(?:to|into) (?:full[- ]?auto|fully automatic|automatic|select[- ]fire|a machine gun)\b",
            r"(?:buy|get|obtain) (?:a |an )?(?:gun|firearm|handgun|pistol|rifle|ar-?15) (?:without (?:a )?"
            r"(?:background check|license|licence|serial number|paperwork)|illegally|on the dark ?web|off the books"
            r"|with no (?:background check|serial number))",
            r"(?:buy|get|obtain) (?:a |an )?(?:ghost gun|untraceable (?:gun|firearm|rifle|pistol))",
        ),
        r"\b(?:to (?:make|build|assemble)|making|building|assembling) " + _ARTICLE + _WEAPON + _RECIPE_OPENING,
        _RECIPE_FOR + r"(?:(?:making|building|assembling|synthesi[sz]ing) )?" + _ARTICLE + _WEAPON,
    ),
    Category.ILLEGAL_DRUGS: (
        _ask(
            _DRUG_MAKE + r" " + _DRUG_AMOUNT + _HARD_DRUG,
            r"(?:buy|get|score|find|order|purchase|source|cop) (?:some |good |pure |cheap )?" + _HARD_DRUG,
            r"(?:buy|get|score|find|order|purchase|obtain) (?:some )?"
            + _RX_DRUG
            + r" (?:without (?:a )?(?:prescription"
            r"|script|doctor)|illegally|on the (?:street|dark ?web))",
            r"(?:lace|cut|mix) [^.!?]{0,20}\bwith fentanyl\b",
        ),
        r"\b(?:step[- ]by[- ]step|detailed|full|complete|exact|working|easy|simple|home|at[- ]home|homemade|diy"
        r"|kitchen) (?:synthesis|synthesi[sz]ing|recipe|production|manufacture|manufacturing|cooking|cook|guide"
        r"|instructions) (?:of |for |to (?:make|cook|synthesi[sz]e) |route (?:for|to) |process for )?" + _HARD_DRUG,
        r"\b(?:shake[- ]and[- ]bake|one[- ]pot) meth\b",
        _RECIPE_FOR + r"(?:(?:making|cooking|synthesi[sz]ing) )?" + _DRUG_AMOUNT + _HARD_DRUG,
        r"\b(?:to (?:make|cook|synthesi[sz]e)|making|cooking|synthesi[sz]ing) " + _HARD_DRUG + _RECIPE_OPENING,
        r"\b(?:buy|order|score|purchase) [^.!?]{0,20}\b(?:" + _HARD_DRUG + r"|" + _RX_DRUG + r") (?:on|off|from)"
        r" (?:the )?(?:dark ?web|darknet|deep web)\b",
    ),
    Category.HARASSMENT: (
        _FIRST_PERSON + r" (?:fucking )?(?:kill|murder|rape|stab|strangle|choke|hurt|shoot|slaughter|behead"
        r"|slit) " + _YOU + r"\b" + _NOT_A_MESSAGE + _NOT_A_GAME,
        _FIRST_PERSON + r" (?:hunt|track) (?:you|u) down\b",
        r"\bi know where (?:you|u) (?:live|sleep)\b(?! (?:is|was)\b)",
        r"\b(?:i )?hope (?:you|u) (?:die|get raped|get cancer|get hit by a (?:car|bus|truck)|burn in hell|rot in hell"
        r"|kill yourself)\b",
        r"\b(?:you|u) (?:deserve|should|need|ought) to (?:die|be raped|get raped|be shot|be killed)\b",
        r"\b(?:you|u)(?:'re| are|r) (?:a |an |such a |such an )?(?:worthless |pathetic |disgusting |useless |fat"
        r" |ugly )?(?:piece of (?:shit|trash|garbage)|waste of (?:space|oxygen|air|skin)|subhuman)\b",
        _ask(
            r"(?:dox|doxx|doxing|doxxing) (?:someone|somebody|him|her|them|this|that|a|my|people)\b",
            r"stalk (?:someone|somebody|him|her|my ex|a (?:girl|guy|woman|man|person|coworker|celebrity|streamer))\b",
            r"(?:cyberbully|bully|harass|blackmail|sextort) (?:someone|somebody|him|her|them|my"
            r"|a|this|people|the new)\b",
            r"(?:track|spy on|monitor|stalk|follow|read|access|hack into|hack) [^.!?]{0,40}\bwithout (?:(?:her|him"
            r"|my (?:wife|husband|girlfriend|boyfriend|partner|ex)) (?:knowing|finding out|noticing)|(?:her|his"
            r"|their) (?:knowledge|consent|permission))",
            r"(?:find|get|look up|dig up|leak|post|publish) (?:the |her |his |their |someone's )?(?:home address"
            r"|real address|phone number|real name|workplace) (?:of|for) (?:this|that|my ex|her|him|someone)\b",
        ),
        r"\b(?:write|send|draft|compose|generate|make|create|post|leave) (?:me )?(?:a |an |some |\d{1,4} |many"
        r" |lots of |hundreds of |a bunch of )?(?:[\w-]{1,30} ){0,2}(?:messages?|texts?|comments?|posts?|emails?"
        r"|tweets?|reviews?|notes?|letters?|dms?) (?:to|that will|that'll|which will|designed to|meant to)"
        r" (?:harass|bully|humiliate|intimidate|threaten|torment|terrify|degrade|make (?:her|him|them) (?:cry"
        r"|feel worthless|kill (?:herself|himself|themselves)))\b",
        r"\b(?:i(?:'ll| will)|i'm going to|i am going to|gonna) (?:leak|post|send|share|publish|release|show)"
        r" (?:your|ur) (?:(?:nudes|nude (?:photos|pics|pictures)|naked (?:photos|pics|pictures)|sex tape"
        r"|intimate (?:photos|pics|pictures|videos))\b|(?:photos|pics|pictures|videos|secrets)\b"
        r"[^.!?]{0,40}\b(?:unless|if (?:you|u) (?:don't|dont|do not)))",
    ),
}
"""The regexes of each category, over normalised text, tried in this order."""

_APOSTROPHES: Final = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})


def normalise(text: str) -> str:
    """The first `MAX_MODERATED_CHARS` of `text`, lower-cased, apostrophes unified, whitespace collapsed."""
    return " ".join(text[:MAX_MODERATED_CHARS].translate(_APOSTROPHES).lower().split())


@dataclass(frozen=True)
class Lexicon:
    """The compiled patterns of some categories; `first_flagged` names the first category that matches."""

    patterns: tuple[tuple[Category, tuple[re.Pattern[str], ...]], ...]

    @classmethod
    def of(cls, categories: Collection[Category]) -> Lexicon:
        """The lexicon of `categories` (in `Category` order, whatever order they are given in)."""
        return cls(
            tuple(
                (category, tuple(re.compile(regex) for regex in _LEXICON[category]))
                for category in Category
                if category in categories
            )
        )

    def first_flagged(self, texts: Iterable[str]) -> Category | None:
        """The first category (in `Category` order) one of `texts` is flagged for, or None.

        Each text is scanned up to its first `MAX_MODERATED_CHARS` characters only.
        """
        normalised = [flat for text in texts if (flat := normalise(text))]
        for category, patterns in self.patterns:
            if any(pattern.search(text) for text in normalised for pattern in patterns):
                return category
        return None
