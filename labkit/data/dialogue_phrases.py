"""Phrase pools of the built-in dialogue-summary generator (labkit.data.dialogues): topics, requests, outcomes, names.

Each topic gives what the first speaker may want (`things`), how they ask for it (`asks`, in the dialogue) and how
the summary says it (`want`), what the second speaker answers when it works out (`agree`, `agreed`), and the words
for a refusal (`cannot`). `{thing}`, `{day}`, `{day2}` and `{time}` are filled by the generator.
"""

from __future__ import annotations

NAMES = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Liam", "Maya",
         "Nikolai", "Olivia", "Pedro", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wes", "Yara", "Zoe", "Amir",
         "Bea", "Chen", "Dora", "Emil")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
TIMES = ("9 am", "10 am", "11 am", "noon", "1 pm", "2 pm", "3 pm", "4 pm", "5 pm", "6 pm", "7 pm", "8 pm")

TOPICS: dict[str, dict[str, list[str] | str]] = {
    "restaurant": {
        "things": ["a table for two", "a table for four", "a table by the window", "a private room for ten",
                   "a table on the terrace", "a table for six"],
        "asks": ["Hi, I'd like to book {thing} for {day}.", "Hello, could I reserve {thing} on {day}?",
                 "Good evening. Is there {thing} free on {day}?", "I'm calling to book {thing} for {day} evening."],
        "want": "wants to book {thing} for {day}",
        "agree": ["Yes, we can give you that at {time}.", "Let me check. Yes, {time} is free.",
                  "No problem, I've put you down for {time}."],
        "agreed": "books it for {time}",
        "cannot": "the restaurant is fully booked",
    },
    "car repair": {
        "things": ["a brake check", "an oil change", "new tyres", "a look at a strange noise", "a battery test",
                   "a broken headlight fixed"],
        "asks": ["Hello, my car needs {thing}. Can you fit me in on {day}?", "Hi, I'm after {thing} on {day}.",
                 "Could your garage do {thing} for me on {day}?", "My car is due for {thing}. Is {day} possible?"],
        "want": "needs {thing} for the car on {day}",
        "agree": ["Sure, bring it in at {time}.", "We have a slot at {time} that day.",
                  "That's fine, drop the car off at {time}."],
        "agreed": "takes the car at {time}",
        "cannot": "the garage has no free slot",
    },
    "doctor": {
        "things": ["a check-up", "a flu vaccination", "a blood test", "a repeat prescription",
                   "an appointment about back pain", "a hearing test"],
        "asks": ["Hello, I'd like to make an appointment for {thing} on {day}.",
                 "Hi, can I see the doctor for {thing} on {day}?", "Good morning, I need {thing}. Is {day} possible?",
                 "Is there any chance of {thing} on {day}?"],
        "want": "wants {thing} at the practice on {day}",
        "agree": ["Dr Patel can see you at {time}.", "We have an opening at {time}.",
                  "Yes, come in at {time} please."],
        "agreed": "gives an appointment at {time}",
        "cannot": "the doctor is fully booked",
    },
    "moving house": {
        "things": ["help carrying boxes", "the van", "help packing the kitchen", "help moving the sofa",
                   "a lift to the new flat", "help assembling the bed"],
        "asks": ["I'm moving on {day}. Could you give me {thing}?", "Would you be free on {day}? I need {thing}.",
                 "Hey, can I ask a favour? I need {thing} on {day} for the move.",
                 "The move is on {day} and I still need {thing}."],
        "want": "is moving house on {day} and asks for {thing}",
        "agree": ["Of course, I'll come over at {time}.", "Sure, I can be there by {time}.",
                  "Happy to help. Is {time} early enough?"],
        "agreed": "agrees to come at {time}",
        "cannot": "they are away that day",
    },
    "concert": {
        "things": ["two tickets for the jazz night", "a ticket for the rock concert", "seats for the opera",
                   "tickets for the choir concert", "a standing ticket for the festival", "tickets for the orchestra"],
        "asks": ["Hi, do you still have {thing} on {day}?", "I'd like to buy {thing} for {day}.",
                 "Hello, are there {thing} left for {day}?", "Can I still get {thing} for {day}?"],
        "want": "wants {thing} on {day}",
        "agree": ["Yes, the show starts at {time}, I'll reserve them.", "We have some left, doors open at {time}.",
                  "Yes, I can sell you those. It starts at {time}."],
        "agreed": "sells them for the {time} show",
        "cannot": "it is sold out",
    },
    "study help": {
        "things": ["help with the maths homework", "notes from the history lecture", "help revising for the exam",
                   "feedback on an essay draft", "help with the physics lab report", "a practice session in French"],
        "asks": ["Could you give me {thing} on {day}?", "I'm stuck. Can we meet on {day}? I need {thing}.",
                 "Do you have time on {day}? I'd like {thing}.", "Would {day} work for {thing}?"],
        "want": "asks for {thing} on {day}",
        "agree": ["Sure, let's meet in the library at {time}.", "Yes, come by at {time}.",
                  "Okay, I'm free at {time}."],
        "agreed": "agrees to meet at {time}",
        "cannot": "they have their own deadline",
    },
    "hotel": {
        "things": ["a double room for two nights", "a single room for one night", "a family room for the weekend",
                   "a room with a sea view", "a quiet room for three nights", "a twin room for a week"],
        "asks": ["Hello, I'd like to book {thing} from {day}.", "Do you have {thing} starting {day}?",
                 "Hi, I'm looking for {thing} from {day}.", "Could I reserve {thing}, arriving {day}?"],
        "want": "wants {thing} from {day}",
        "agree": ["Yes, that's available. Check-in is from {time}.", "We have one. You can check in at {time}.",
                  "That's fine, the room is ready from {time}."],
        "agreed": "books the room with check-in at {time}",
        "cannot": "the hotel is full",
    },
    "borrowing": {
        "things": ["your ladder", "your drill", "your camping tent", "your bike", "your projector",
                   "your big cooking pot"],
        "asks": ["Could I borrow {thing} on {day}?", "Hey, would you lend me {thing} for {day}?",
                 "I need {thing} on {day}. Could I borrow it?", "Is {thing} free on {day}? I'd like to borrow it."],
        "want": "asks to borrow {thing} on {day}",
        "agree": ["Sure, pick it up at {time}.", "No problem, come and get it at {time}.",
                  "Yes, I'll leave it out for you at {time}."],
        "agreed": "lends it, to be picked up at {time}",
        "cannot": "they need it themselves",
    },
}

GREETINGS = ["Hi {b}, it's {a}.", "Hello {b}.", "Good morning, {b}.", "Hey {b}, have you got a minute?",
             "Hi there.", "Hello, this is {a}.", "Evening, {b}."]
REPLIES = ["Hi {a}, what can I do for you?", "Hello {a}. How can I help?", "Sure, go ahead.", "Hi! What's up?",
           "Good to hear from you, {a}.", "Yes, of course. What do you need?"]
SMALL_TALK = ["The weather has been awful this week.", "I hope I'm not calling too late.", "It's been a busy week.",
              "Sorry, I'm in a bit of a rush today.", "I tried to reach you yesterday.", ""]
ACCEPT = ["Perfect, thank you.", "Great, that works for me.", "Wonderful, see you then.", "That's ideal, thanks a lot.",
          "Brilliant. Thanks!"]
SORRY = ["I'm sorry, {day} won't work because {cannot}.", "Unfortunately {cannot} on {day}.",
         "I'm afraid {day} is impossible, {cannot}."]
OFFER = ["But {day2} at {time} would be fine.", "How about {day2} at {time} instead?", "I could do {day2} at {time}."]
GIVE_UP = ["Never mind, I'll ask someone else.", "Oh well, I'll try somewhere else.", "No problem, I'll find another way."]
CLOSINGS = ["Bye!", "Thanks, bye.", "Talk soon.", "Take care.", "Have a good day.", "See you."]
