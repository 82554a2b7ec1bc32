"""Who-is-the-spy: reading votes, descriptions and own-word leaks from messy model output."""

import pytest

from templates.who_is_the_spy.parsing import (
    VoteStatus,
    clean_description,
    mentions_word,
    parse_vote,
    read_seat,
)

ALIVE = [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("text", "seat"),
    [
        ("I vote for player 3!", 3),
        ("3", 3),
        ("Player three", 3),
        ("**Player 4**", 4),
        ("P2", 2),
        ("Vote: 5", 5),
        ("I think player 2 is odd, but I vote for player 4.", 4),
        ("My vote: #1", 1),
        ("<think>player 5 maybe</think> Player 2", 2),
        ("Player 3 is the spy. Player 3!", 3),
        ("", None),
        ("I have no idea", None),
        ("Player 1 or player 2", None),
        ("1 2 3", None),
        ("<think>I vote for 3", None),
        # found in the embedded model's votes (issue 17 pilots)
        ("2.", 2),
        ("The answer is 2.", 2),
        ("I vote for Player 2.", 2),
        ("two", 2),
        ("The spy is player two.", 2),
        ("Player 2 is the spy", 2),
        ("Which one?", None),
        ("Two, no pun planned.", 2),
        ("One: you pick 1", 1),
        ("Two of them, two don't", None),
        ("Two, 3.", None),
        ("Players 2, 3.", None),
        ("Three\n\nRound 1. To", None),
        ("I vote for 2, no, I vote for 3", None),
        ("1.5", None),
        ("The spy is 2 or 3", None),
        ("I vote for player 2 and player 3", None),
        ("Player 2, 2. This", 2),
    ],
)
def test_read_seat(text, seat):
    assert read_seat(text) == seat


@pytest.mark.parametrize(
    ("text", "voter", "seat"),
    [
        ("Player 3: 2", 3, 2),  # the voter's own transcript-style label is dropped
        ("Player 3: I vote for 1", 3, 1),
        ("Player 3: a red fruit", 3, None),
        ("Player 2: 1", 3, None),  # another seat's label and another seat: ambiguous
        ("Player 2: a red fruit", 3, None),  # a description attributed to player 2, not a vote
        ("Player 2: player 2", 3, 2),
        ("Player 2: 1", None, 1),
    ],
)
def test_read_seat_leading_labels(text, voter, seat):
    assert read_seat(text, voter) == seat


def test_parse_vote_applies_the_rules():
    assert parse_vote("I vote for player 3", voter=1, alive=ALIVE).status == VoteStatus.VALID
    assert parse_vote("player 1", voter=1, alive=ALIVE).status == VoteStatus.SELF
    assert parse_vote("player 9", voter=1, alive=ALIVE).status == VoteStatus.NOT_ALIVE
    assert parse_vote("player 5", voter=1, alive=[1, 2, 3]).status == VoteStatus.NOT_ALIVE
    vote = parse_vote("everyone!", voter=1, alive=ALIVE)
    assert vote.status == VoteStatus.UNPARSED and vote.target is None and not vote.valid


@pytest.mark.parametrize(
    ("text", "word", "leak"),
    [
        ("It is an apple.", "apple", True),
        ("APPLES are red", "apple", True),
        ("a-p-p-l-e", "apple", True),
        ("it's A P P L E", "apple", True),
        ("apple-pie is nice", "apple", True),
        ("I like pineapple juice", "apple", False),
        ("It grows on trees and is red.", "apple", False),
        ("a sweet   potato dish", "sweet potato", True),
        ("sweet drinks and potato chips", "sweet potato", False),
        ("Un café, s'il vous plaît", "cafe", True),
        ("a cat sat", "cat", True),
        ("concatenate", "cat", False),
        ("", "cat", False),
    ],
)
def test_mentions_word(text, word, leak):
    assert mentions_word(text, word) is leak


@pytest.mark.parametrize(
    ("text", "public"),
    [
        ("It is sweet and red.", "It is sweet and red."),
        ("\n\n  Player 2: it is round \n more lines", "it is round"),
        ('Description: "a fruit"', "a fruit"),
        ("<think>my word is apple</think>It is a fruit.", "It is a fruit."),
        ("<think>unclosed", ""),
        ("", ""),
        ("x" * 1000, "x" * 200),
    ],
)
def test_clean_description(text, public):
    assert clean_description(text) == public
